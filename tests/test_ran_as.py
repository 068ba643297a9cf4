"""trainer/ran_as.py: the run's hyperparameters say what ran. A job asked for FSDP that ran as DDP (no
accelerator) records ``fsdp_requested`` beside ``distributed: ddp``, not a sharded job (issue 41 §4);
the prepared models are real torch modules (DDP in a one-rank gloo process group)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from trainer.ran_as import distributed, hparams  # noqa: E402

ASKED = {"fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {"min_num_params": 0}, "learning_rate": 2e-5}


def test_fsdp_asked_for_and_run_as_ddp_is_recorded_as_asked_not_as_run(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        trainer = SimpleNamespace(model_wrapped=DistributedDataParallel(torch.nn.Linear(4, 4)))
        assert distributed(trainer) == "ddp"
        assert hparams(ASKED, trainer) == {"fsdp": [], "fsdp_requested": ["full_shard", "auto_wrap"],
                                           "fsdp_config_requested": {"min_num_params": 0}, "learning_rate": 2e-5,
                                           "distributed": "ddp"}
    finally:
        dist.destroy_process_group()


def test_a_single_process_says_so_and_unknown_wrappers_change_nothing() -> None:
    single = SimpleNamespace(model_wrapped=torch.nn.Linear(4, 4))
    assert hparams(ASKED, single)["distributed"] == "single" and hparams(ASKED, single)["fsdp"] == []
    unasked = {"fsdp": [], "learning_rate": 1.0}
    assert hparams(unasked, single) is unasked, "what ran as asked stays as HF's own callbacks record it"
    assert hparams(ASKED, None) == ASKED  # a Trainer the callback does not hold: as asked
    flagged = hparams({"fsdp": True}, single)  # (a transformers that records it as a flag)
    assert flagged == {"fsdp": False, "fsdp_requested": True, "distributed": "single"}
