"""What ran, in the run's hyperparameters: a job that asked for FSDP where accelerate cannot shard
runs plain DDP, and every tracker would show it as sharded from the Trainer's arguments alone.
:func:`hparams` moves ``fsdp``/``fsdp_config`` to ``*_requested`` and adds ``distributed`` there
(docs/trainer.md, "Flags").
"""
from __future__ import annotations

import sys
from typing import Any


def distributed(trainer: Any) -> str | None:
    """How ``trainer``'s prepared model runs (call once it is wrapped: on_train_begin); None where
    that is not known (no trainer, nothing prepared yet)."""
    model = getattr(trainer, "model_wrapped", None)
    torch = sys.modules.get("torch")
    if model is None or torch is None:
        return None
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, (FSDPModule, FullyShardedDataParallel)):
        return "fsdp"
    if isinstance(model, DistributedDataParallel):
        return "ddp"
    return "single"


def hparams(arguments: dict[str, Any], trainer: Any) -> dict[str, Any]:
    """The Trainer's arguments (``args.to_dict()``) as they ran (see the module's docstring)."""
    if not arguments.get("fsdp"):
        return arguments
    ran = distributed(trainer)
    if ran is None or ran == "fsdp":
        return arguments
    out = {**arguments, "distributed": ran, "fsdp_requested": arguments["fsdp"]}
    # what the Trainer's arguments say when not asked: [], False
    out["fsdp"] = type(out["fsdp"])()
    if "fsdp_config" in out:
        out["fsdp_config_requested"] = out.pop("fsdp_config")
    return out
