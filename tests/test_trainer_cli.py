"""``python -m trainer`` before anything starts: a model it cannot load is one line and exit 2 in
about a second (no relay, no output folder, no transformers imported), and ``--help`` is fast, lists
every flag the parser takes, and says each default once."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port
from trainer_fixtures import error_lines, run_trainer

TRAIN = [sys.executable, "-m", "trainer"]
HEAVY = ("transformers", "trl", "torch")


def imported(stderr: str) -> set[str]:
    """Top-level packages from ``python -X importtime`` output."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("model, says", [
    ("nosuchorg/model", "--model_name_or_path: nosuchorg/model is no folder here, and the Hugging Face cache holds no "
                        "model 'nosuchorg/model' (the hub is off: HF_HUB_OFFLINE); give the model's folder, or "
                        "download it first (hf download nosuchorg/model)"),
    ("models/tiny-lama", "--model_name_or_path: models/tiny-lama does not exist; give the folder that holds the model"),
    ("./nothing/here", "--model_name_or_path: ./nothing/here does not exist; give the folder that holds the model"),
    ("a/b/c", "--model_name_or_path: a/b/c is neither a folder nor a Hugging Face model id (ORG/NAME)"),
], ids=["hub-id-not-cached", "mistyped-relative-path", "missing-path", "not-an-id"])
def test_a_model_it_cannot_load_is_one_line_before_anything_starts(tmp_path: Path, model: str, says: str) -> None:
    (tmp_path / "models" / "tiny-llama").mkdir(parents=True)  # the folder the mistyped path meant
    out = tmp_path / "out"
    done = subprocess.run([*TRAIN[:1], "-X", "importtime", *TRAIN[1:], "--model_name_or_path", model,
                           "--data_path", "data.jsonl", "--output_dir", str(out)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=_env(HF_HUB_OFFLINE="1"))
    assert done.returncode == 2
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and errors[0].split(" ERROR trainer: ", 1)[1].startswith(says), errors
    assert not out.exists(), "nothing started: no output folder, no relay"
    assert not imported(done.stderr) & set(HEAVY), "checked before transformers is imported"
    tokenizer = subprocess.run([*TRAIN, "--demo", "--tokenizer_name_or_path=nosuchorg/tok", "--output_dir", str(out)],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env(HF_HUB_OFFLINE="1"))
    assert tokenizer.returncode == 2 and "--tokenizer_name_or_path: nosuchorg/tok is no folder" in tokenizer.stderr


def test_a_hub_id_in_the_cache_is_taken_and_online_the_hub_is_asked_once(tmp_path: Path) -> None:
    """A real Hugging Face cache folder (as huggingface_hub lays it out) holding org/cached; online, a
    hub that cannot be reached (HF_ENDPOINT at a port nothing listens on) is said at once."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("abc123")
    check = "from trainer.model_source import check_source; check_source('model_name_or_path', {!r})"
    closed = f"http://127.0.0.1:{free_port()}"
    for model, env, says in (("org/cached", {"HF_HUB_OFFLINE": "1"}, None), ("org/cached", {}, None),
                             ("org/other", {"HF_HUB_OFFLINE": "1"}, "the Hugging Face cache holds no model 'org/other'"),
                             ("org/other", {}, "cannot ask the Hugging Face hub about org/other (ConnectError")):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", check.format(model)], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path, env={**_env(**env), "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": closed})
        assert (done.returncode == 0) == (says is None), (model, env, done.stderr[-1000:])
        assert says is None or says in done.stderr.splitlines()[-1], done.stderr[-1000:]
        assert time.monotonic() - started < 50, "one question, no retries"


def test_help_is_fast_lists_every_flag_and_says_each_default_once() -> None:
    done = subprocess.run([*TRAIN[:1], "-X", "importtime", *TRAIN[1:], "--help"], capture_output=True, text=True,
                          timeout=60, env=_env(COLUMNS="100"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not imported(done.stderr) & set(HEAVY), "help imports neither transformers, trl nor torch"
    flags = _flags(done.stdout)
    assert {"--demo", "--model_name_or_path", "--tracker", "--relay_address", "--output_dir", "--learning_rate",
            "--num_train_epochs", "--logging_steps", "--max_length", "--dataset_text_field"} <= flags
    entries = re.split(r"\n  (?=--)", done.stdout)
    assert not [e for e in entries if e.count("(default") > 1], "a default said twice"
    assert "(default: None)" not in done.stdout
    learning = next(e for e in entries if e.startswith("--learning_rate "))
    assert "(default: 2e-05)" in learning  # SFTConfig's, not TrainingArguments' 5e-05


def test_help_fits_80_columns() -> None:
    """In an 80-column terminal every line fits, but a flag whose name and metavar alone are longer
    (transformers' --restore_callback_states_from_checkpoint): argparse cannot wrap those."""
    done = subprocess.run([*TRAIN, "--help"], capture_output=True, text=True, timeout=60, env=_env(COLUMNS="80"))
    assert done.returncode == 0, done.stderr[-2000:]
    wide = [line for line in done.stdout.splitlines()
            if len(line) > 80 and not re.fullmatch(r"  --[a-z0-9_]+ [A-Z0-9_]+", line)]
    assert not wide, wide
    assert "fms-hf-tuning's flag names" in done.stdout


@pytest.mark.slow  # imports transformers and trl, as parsing does
def test_help_lists_exactly_the_flags_the_parser_takes() -> None:
    code = ("from trainer.args import DataArguments, ModelArguments, TrackingArguments\n"
            "from transformers import HfArgumentParser\nfrom trl import SFTConfig\n"
            "p = HfArgumentParser((ModelArguments, DataArguments, TrackingArguments, SFTConfig))\n"
            "print(' '.join(o for a in p._actions for o in a.option_strings if o.startswith('--') and '-' not in o[2:]))")
    parser = run_trainer([sys.executable, "-c", code], timeout=600)
    assert parser.returncode == 0, parser.stderr[-2000:]
    shown = subprocess.run([*TRAIN, "--help"], capture_output=True, text=True, timeout=60, env=_env())
    from trainer.argv_rewrite import ALIASES, PEFT_METHOD
    from trainer.fms_flags import FMS_SWITCHES

    mapped = {*ALIASES, PEFT_METHOD, *FMS_SWITCHES}  # the seed's and fms-hf-tuning's names, mapped before parsing
    assert {"--evaluation_strategy", "--r", "--training_data_path", "--peft_method"} <= _flags(shown.stdout)
    assert _flags(shown.stdout) - mapped == set(parser.stdout.split()) - {"--help"}


def _flags(help_text: str) -> set[str]:
    return set(re.findall(r"^  (--[a-z0-9_]+)", help_text, re.M))


def _env(**extra: str) -> dict[str, str]:
    from trainer_fixtures import trainer_env
    env = trainer_env(**extra)
    if "HF_HUB_OFFLINE" not in extra:
        env.pop("HF_HUB_OFFLINE", None)
    return env


def test_a_librarys_warning_is_printed_once() -> None:
    """huggingface_hub prints its warnings with a handler of its own; the trainer's logging does not
    print them a second time (each hub retry was said twice)."""
    code = ("from trainer.sft import _configure_logging; _configure_logging()\n"
            "from huggingface_hub.utils import logging as hub_logging\n"
            "hub_logging.get_logger('huggingface_hub.utils._http').warning('retrying once')\n"
            "import logging; logging.getLogger('trainer').warning('ours once')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("retrying once") == 1 and done.stderr.count("ours once") == 1, done.stderr
