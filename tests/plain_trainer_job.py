"""A user's own training script: a plain ``transformers.Trainer`` (no trl, no peft) on the demo's tiny
model and data, with the one line this project asks for, ``callbacks=[RelayCallback()]``. Runs on
transformers 4.46 to 5.x, alone or under ``torchrun``; what it tracks and where comes from the
environment (RELAY_ADDRESS, RELAY_TRACKERS ...), as in a job launched by someone else's script.

    python tests/plain_trainer_job.py OUTPUT_DIR [MAX_STEPS] [--run-name NAME] [--fail-at STEP]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from trainer import RelayCallback, track
from trainer.argv_rewrite import DEMO_DATA
from trainer.demo import build_demo


class FailAt(TrainerCallback):
    """Raise in the training loop at a step: a job that dies of its own error."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):  # the Trainer's hook
        if state.global_step >= self.step:
            raise RuntimeError(f"failing at step {state.global_step} as asked")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("max_steps", type=int, nargs="?", default=6)
    parser.add_argument("--run-name")
    parser.add_argument("--fail-at", type=int)
    opts = parser.parse_args()
    model_dir = os.environ.get("DEMO_MODEL_DIR") or os.path.join(opts.output_dir, "demo-model")
    args = TrainingArguments(output_dir=opts.output_dir, max_steps=opts.max_steps, logging_steps=1,
                             per_device_train_batch_size=4, learning_rate=1e-2, report_to="none",
                             save_strategy="no", use_cpu=True, dataloader_num_workers=0,
                             run_name=opts.run_name, disable_tqdm=True)
    with args.main_process_first(local=True):
        build_demo(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with open(DEMO_DATA, encoding="utf-8") as fh:
        texts = [json.loads(line)["output"] for line in fh if line.strip()]
    rows = [tokenizer(text, truncation=True, max_length=64) for text in texts]
    callbacks: list[TrainerCallback] = [RelayCallback()]
    if opts.fail_at is not None:
        callbacks.append(FailAt(opts.fail_at))
    track({"rows": len(rows)})  # before the Trainer exists: held until the callback connects
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
