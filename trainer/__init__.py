"""The training side of metrics-relay: the SFT entry point, the per-rank callback and tracking API.

``track`` and ``set_params`` import nothing heavy, so scripts can call them before torch loads.
"""
from typing import Any

from trainer.custom_metrics import set_params, track

__all__ = ["set_params", "track", "train"]


def __getattr__(name: str) -> Any:  # train pulls in torch/transformers; load it only when asked for
    if name == "train":
        from trainer.sft import train

        return train
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
