"""A user's own accelerate loop (the shape of Hugging Face's ``*_no_trainer.py`` examples) on a tiny
torch model, with the one line this project asks for, ``log_with=[RelayTracker()]``, beside a tracker
of accelerate's kind that counts the calls it gets on each rank (accelerate's own dispatch, left as it
was). Runs alone or under ``torchrun`` (gloo, CPU); every rank logs its own loss at every step.

    python tests/accelerate_job.py PROJECT_DIR [STEPS] [--fail-at STEP]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker

from trainer import RelayTracker, track

CONFIG = {"learning_rate": 0.05, "batch_size": 4, "model": "linear-8-1"}


class CallCounter(GeneralTracker):
    """Counts accelerate's calls of its trackers on this rank; writes them at ``finish``."""

    name = "call_counter"
    requires_logging_directory = False

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder
        self.calls = {"start": 0, "store_init_configuration": 0, "log": 0, "finish": 0}

    @property
    def tracker(self) -> None:
        return None

    def start(self) -> None:
        self.calls["start"] += 1

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.calls["store_init_configuration"] += 1

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.calls["log"] += 1

    def finish(self) -> None:
        self.calls["finish"] += 1
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(self.folder, f"calls-rank{rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(self.calls, fh)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("project_dir")
    parser.add_argument("steps", type=int, nargs="?", default=4)
    parser.add_argument("--fail-at", type=int)
    opts = parser.parse_args()
    os.makedirs(opts.project_dir, exist_ok=True)
    track({"rows": 64})  # before the tracker connects: held until it does, then sent from this rank
    counter = CallCounter(opts.project_dir)
    accelerator = Accelerator(cpu=True, project_dir=opts.project_dir, log_with=[RelayTracker(), counter])
    accelerator.init_trackers("accelerate demo", config=CONFIG)
    torch.manual_seed(accelerator.process_index)  # each rank its own data, so its own loss
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=CONFIG["learning_rate"])
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(1, opts.steps + 1):
        rows = slice((step - 1) * 4 % 64, (step - 1) * 4 % 64 + 4)
        loss = torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if opts.fail_at is not None and step >= opts.fail_at:
            raise RuntimeError(f"failing at step {step} as asked")
        accelerator.log({"loss": loss.detach(), "epoch": 0, "note": "text"}, step=step)
    accelerator.log({"eval_loss": 0.5}, step=opts.steps)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
