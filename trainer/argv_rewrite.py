"""The command line's words before they are parsed: the seed's renamed flags and fms-hf-tuning's
names mapped onto ours, every ``--tracker`` merged into one, and ``--demo``'s defaults put first.
"""
from __future__ import annotations

import os

from trainer import fms_flags
from trainer.errors import UsageError
from trainer.tracker_flags import TRACKERS

#: Flags of the seed's command line that transformers 5 renamed: old flag -> (new flag, note).
RENAMED_FLAGS = {
    "--evaluation_strategy": "--eval_strategy",
    "--warmup_ratio": "--warmup_steps",  # transformers 5: warmup_steps < 1 is a ratio
    "--max_seq_length": "--max_length",  # trl 1.x name
}
RENAMED_FLAGS.update({old.replace("_", "-"): new for old, new in RENAMED_FLAGS.items()})
#: Every flag mapped onto another before parsing: the seed's renamed ones and fms-hf-tuning's names
#: (their dashed spellings too, as HfArgumentParser gives every flag one).
ALIASES = {**RENAMED_FLAGS, **fms_flags.FMS_ALIASES}
ALIASES.update({old.replace("_", "-"): new for old, new in fms_flags.FMS_ALIASES.items()})
#: fms-hf-tuning's ``--peft_method``: rewritten into ``--use_peft`` (trainer/fms_flags.py).
PEFT_METHOD = "--peft_method"

DEMO_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                         "demo_instructions.jsonl")
DEMO_RESPONSE_TEMPLATE = "\n### Response:"

#: What --demo means; any flag given on the command line overrides these.
DEMO_DEFAULTS = [
    "--data_path", DEMO_DATA,
    "--dataset_text_field", "output",
    "--response_template", DEMO_RESPONSE_TEMPLATE,
    "--use_peft", "True",
    "--target_modules", "all-linear",  # q/v-only adapters barely move a randomly initialised model
    "--max_length", "96",
    "--per_device_train_batch_size", "8",
    "--num_train_epochs", "1",
    "--max_steps", "30",
    "--learning_rate", "1e-2",
    "--logging_steps", "5",
    "--save_strategy", "no",
    "--report_to", "none",
    "--dataloader_num_workers", "0",
    "--use_cpu", "True",
    "--bf16", "False",
    "--activation_checkpointing", "False",  # recomputation only slows a model this small
]


def rewrite_argv(argv: list[str]) -> list[str]:
    """Map the seed's renamed flags and fms-hf-tuning's names onto ours, merge every --tracker
    (fms's list ``--tracker aim mlflow``, our ``aim,mlflow``, repeated) and apply --demo
    defaults."""
    out: list[str] = []
    trackers: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        name = ALIASES.get(name, name)
        values = [value] if eq else _values(argv, i + 1)
        i += 1 + (0 if eq else len(values))
        if name == "--tracker":
            if not values:
                raise UsageError(f"argument --tracker: expected a value ({', '.join(TRACKERS)})")
            trackers += values
        elif name in fms_flags.FMS_SWITCHES and not eq:
            out += fms_flags.FMS_SWITCHES[name] + values
        elif name == PEFT_METHOD:
            if len(values) != 1:
                raise UsageError("argument --peft_method: expected one value: lora or none")
            out += ["--use_peft", fms_flags.peft_method(values[0])]
        else:
            out += [name + eq + value, *values]
    if trackers:
        out += ["--tracker", ",".join(trackers)]
    if demo_requested(out):
        out = DEMO_DEFAULTS + out
    return out


def _values(argv: list[str], start: int) -> list[str]:
    """The words after a flag up to the next flag: its values."""
    end = start
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return argv[start:end]


def demo_requested(argv: list[str]) -> bool:
    """``--demo``, ``--demo True`` or ``--demo=yes``; the last occurrence wins, as in argparse."""
    wanted = False
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name != "--demo":
            continue
        if not eq:
            following = argv[i + 1] if i + 1 < len(argv) else ""
            value = "" if following.startswith("--") else following
        wanted = value.lower() not in ("false", "f", "no", "n", "0")
    return wanted


def has_flag(argv: list[str], flag: str) -> bool:
    """Whether ``flag`` (or its dashed spelling) is on the command line, bare or as
    ``--flag=value``."""
    names = {flag, "--" + flag[2:].replace("_", "-")}
    return any(a.partition("=")[0] in names for a in argv)
