"""The training side of metrics-relay: the SFT entry point, the per-rank callback and tracking API.

``track`` and ``set_params`` import nothing heavy, so scripts can call them before torch loads;
``RelayCallback`` (transformers), ``RelayTracker`` (accelerate) and ``train`` (torch, trl, peft) are
imported when first asked for.
"""
from typing import Any

from trainer.custom_metrics import set_params, track

__all__ = ["RelayCallback", "RelayTracker", "set_params", "track", "train"]


def __getattr__(name: str) -> Any:  # transformers or accelerate (train: torch, trl), when asked
    if name == "train":
        from trainer.sft import train

        return train
    if name == "RelayCallback":
        from trainer.callback import RelayCallback

        return RelayCallback
    if name == "RelayTracker":
        from trainer.accelerate_tracker import RelayTracker

        return RelayTracker
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
