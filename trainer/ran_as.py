"""What ran, in the run's hyperparameters: the Trainer's arguments say what was asked for, and a job
asked for FSDP where accelerate cannot shard (no accelerator: it runs plain DDP, trainer/args.py
says so in one line) would be shown as sharded by every tracker. The callback publishes the
arguments through :func:`hparams`, which adds ``distributed`` (``fsdp``, ``ddp`` or ``single``: the
model the Trainer prepared) and, where FSDP was asked for and did not run, moves ``fsdp`` and
``fsdp_config`` to ``fsdp_requested`` and ``fsdp_config_requested`` (``fsdp`` then says what it says
when not asked: ``[]``, or ``False`` in transformers versions that record a flag).
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
    ran = distributed(trainer)
    if ran is None:
        return arguments
    out = {**arguments, "distributed": ran}
    if out.get("fsdp") and ran != "fsdp":
        out["fsdp_requested"] = out["fsdp"]
        # what the Trainer's arguments say when not asked: [], False
        out["fsdp"] = type(out["fsdp"])()
        if "fsdp_config" in out:
            out["fsdp_config_requested"] = out.pop("fsdp_config")
    return out
