"""How the model is loaded: fms-hf-tuning's ``--torch_dtype`` and ``--use_flash_attn``, checked
before anything starts and turned into ``from_pretrained``'s arguments."""
from __future__ import annotations

import importlib.util
import logging
from typing import Any, Protocol

from trainer.errors import UsageError

log = logging.getLogger(__name__)
FLASH_ATTENTION = "flash_attention_2"  # what fms-hf-tuning's --use_flash_attn loads


class LoadFlags(Protocol):
    torch_dtype: str | None
    use_flash_attn: bool


def check_load_flags(model: LoadFlags, rank0: bool) -> None:
    """UsageError for a dtype torch lacks, or flash attention asked for on CUDA without flash-attn;
    without CUDA, flash attention is turned off and rank 0 says so in one line."""
    import torch

    dtype = model.torch_dtype
    if (dtype is not None and dtype != "auto"
            and not isinstance(getattr(torch, dtype, None), torch.dtype)):
        raise UsageError(f"--torch_dtype: {dtype!r} is not a torch dtype; use auto, float32, "
                         "bfloat16 or float16")
    if not model.use_flash_attn:
        return
    if not torch.cuda.is_available():
        model.use_flash_attn = False
        if rank0:
            log.warning("--use_flash_attn: no CUDA device here, so flash attention is off (the "
                        "model's default attention)")
    elif importlib.util.find_spec("flash_attn") is None:
        raise UsageError("--use_flash_attn needs the flash-attn package (pip install flash-attn); "
                         "or drop the flag for the model's default attention")


def load_kwargs(model: LoadFlags) -> dict[str, Any]:
    """``from_pretrained``'s keyword arguments for the model (not the tokenizer)."""
    kwargs: dict[str, Any] = {}
    if model.torch_dtype is not None:
        kwargs["dtype"] = model.torch_dtype
    if model.use_flash_attn:
        kwargs["attn_implementation"] = FLASH_ATTENTION
    return kwargs
