"""The training side of metrics-relay: the SFT entry point, the per-rank callback and tracking API.

``track`` and ``set_params`` import nothing heavy, so scripts can call them before torch loads;
``RelayCallback`` (transformers) and ``train`` (torch, trl, peft) are imported when first asked for.
"""
from typing import Any

from trainer.custom_metrics import set_params, track

__all__ = ["RelayCallback", "set_params", "track", "train"]


def __getattr__(name: str) -> Any:  # each pulls in transformers (train: torch, trl); loaded when asked for
    if name == "train":
        from trainer.sft import train

        return train
    if name == "RelayCallback":
        from trainer.callback import RelayCallback

        return RelayCallback
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
