"""What ran, in the run's hyperparameters: the Trainer's arguments say what was asked for, and a job
asked for FSDP where accelerate cannot shard (no accelerator: it runs plain DDP, trainer/args.py
says so in one line) would be shown as sharded by every tracker. The callback publishes the
arguments through :func:`hparams`: where FSDP was asked for and did not run, it moves ``fsdp`` and
``fsdp_config`` to ``fsdp_requested`` and ``fsdp_config_requested`` (``fsdp`` then says what it says
when not asked: ``[]``, or ``False`` in transformers versions that record a flag) and adds
``distributed`` (``ddp`` or ``single``: the model the Trainer prepared). Elsewhere the arguments are
what ran, and stay as Hugging Face's own callbacks record them.
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
