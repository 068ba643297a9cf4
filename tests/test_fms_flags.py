"""fms-hf-tuning 3.2.2's flags in ``python -m trainer`` (issue 39 §4, §6): fms's own parser (in the
compatibility venv, tests/compat_env.py) and ours read the command lines of fms's docs and mean the
same; every fms flag is either ours or refused in one line naming what to use instead; and
``--tracker aim --aim_remote_server_ip/--aim_remote_server_port`` trains into a real ``aim server``."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aim_server import aim_server, index_like_aim_up  # noqa: F401  (a fixture, used by name)
from compat_env import run_fms
from conftest import read_jsonl
from sink_readback import read_repo
from trainer_fixtures import ROOT, error_lines, run_trainer

MEANINGS = Path(__file__).resolve().parent / "flag_meanings.py"
CASES = Path(__file__).resolve().parent / "trainer_cases.py"
TRAIN = [sys.executable, "-m", "trainer"]

#: The command lines of fms-hf-tuning's docs (docs/training.md, docs/tuning-techniques.md,
#: docs/experiment-tracking.md), with their typos put right where fms would silently ignore a flag:
#: ``--data_formatter_template:`` (with a colon) and ``---learning_rate`` (three dashes).
#: {model}, {data}, {out}, {aim} are the test's folders.
COMMON = ["--model_name_or_path", "{model}", "--training_data_path", "{data}", "--output_dir", "{out}"]
DOC_CASES = {
    "training.md: single sequence": [
        *COMMON, "--tokenizer_name_or_path", "{model}", "--num_train_epochs", "5",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4", "--learning_rate", "1e-5",
        "--response_template", "\\n### Response:", "--dataset_text_field", "output"],
    "training.md: formatter template": [
        *COMMON, "--num_train_epochs", "5", "--per_device_train_batch_size", "4", "--learning_rate", "1e-5",
        "--response_template", "\\n## Label:", "--data_formatter_template",
        "### Input: {{input}} \\n\\n## Label: {{output}}"],
    "training.md: FSDP with accelerate": [
        *COMMON, "--torch_dtype", "bfloat16", "--num_train_epochs", "5", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "4", "--learning_rate", "1e-5", "--response_template",
        "\\n### Response:", "--dataset_text_field", "output", "--tokenizer_name_or_path", "{model}"],
    "training.md: GPT-OSS (its data config and MXFP4 left out)": [
        *COMMON, "--gradient_accumulation_steps", "1", "--per_device_train_batch_size", "2",
        "--num_train_epochs", "1", "--torch_dtype", "bfloat16", "--learning_rate", "2e-4",
        "--warmup_ratio", "0.03", "--lr_scheduler_type", "cosine", "--max_seq_length", "4096",
        "--logging_steps", "1", "--response_template", "\\n### Response:", "--dataset_text_field", "output",
        "--gradient_checkpointing", "True", "--peft_method", "lora", "--lora_r", "8", "--lora_alpha", "16",
        "--lora_dropout", "0.0", "--target_modules", "all-linear", "--use_flash_attn", "True",
        "--tracker", "aim", "--aim_repo", "{aim}", "--experiment", "gpt-oss-120b-lora-tuning"],
    "tuning-techniques.md: LoRA": [
        *COMMON, "--tokenizer_name_or_path", "{model}", "--num_train_epochs", "40",
        "--per_device_train_batch_size", "4", "--learning_rate", "1e-4", "--response_template", "\\n## Label:",
        "--dataset_text_field", "output", "--peft_method", "lora", "--r", "8", "--lora_dropout", "0.05",
        "--lora_alpha", "16", "--target_modules", "c_attn", "c_proj"],
    "tuning-techniques.md: fine tuning": [
        *COMMON, "--num_train_epochs", "5", "--per_device_train_batch_size", "4", "--learning_rate", "1e-5",
        "--response_template", "\\n## Label:", "--dataset_text_field", "output", "--peft_method", "None"],
    "experiment-tracking.md: aim": [
        *COMMON, "--response_template", "\\n### Response:", "--dataset_text_field", "output",
        "--tracker", "aim", "--aim_repo", "{aim}", "--experiment", "sft-test"],
    "issue 39: fms's tracker list": [
        *COMMON, "--response_template", "\\n### Response:", "--dataset_text_field", "output",
        "--tracker", "aim", "mlflow", "--aim_repo", "{aim}", "--mlflow_experiment", "ml-exp"],
    "issue 39: --trackers with file_logger": [
        *COMMON, "--response_template", "\\n### Response:", "--dataset_text_field", "output",
        "--trackers", "file_logger", "aim", "--aim_repo", "{aim}", "--aim_experiment", "aim-exp",
        "--experiment", "both"],
    "issue 39: remote Aim by --aim_url": [
        *COMMON, "--response_template", "\\n### Response:", "--dataset_text_field", "output",
        "--tracker", "aim", "--aim_url", "aim://127.0.0.1:53800/", "--experiment", "remote"],
    "issue 39: export path, journal name, metadata": [
        *COMMON, "--response_template", "\\n### Response:", "--dataset_text_field", "output",
        "--tracker", "mlflow", "--run_uri_export_path", "{out}/exports", "--training_logs_filename",
        "train.jsonl", "--exp_metadata", '{"gpu": "A100-80G"}'],
}
#: Where fms and we differ in a default (docs/trainer.md), the meaning is compared only when the
#: command line gives one of these flags.
GIVEN_ONLY = {
    "lora_alpha": ("--lora_alpha",), "torch_dtype": ("--torch_dtype",), "flash_attn": ("--use_flash_attn",),
    "text_field": ("--dataset_text_field",),
    **{name: (f"--{name}",) for name in ("num_train_epochs", "per_device_train_batch_size",
                                         "gradient_accumulation_steps", "learning_rate", "logging_steps",
                                         "lr_scheduler_type", "logging_strategy", "save_strategy")},
}


def _folders(tmp_path: Path) -> dict[str, str]:
    """A model folder (the parsers only check that it is one) and data both templates fit."""
    model, out = tmp_path / "model", tmp_path / "out"
    model.mkdir()
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"{n} + 1", "output": f"### Input: {n} + 1\n## Label: {n + 1}"
                                        f"\n### Response: {n + 1}"}) + "\n" for n in range(4)))
    return {"model": str(model), "data": str(data), "out": str(out), "aim": str(tmp_path / "aim")}


def _fill(word: str, where: dict[str, str]) -> str:
    for name, path in where.items():
        word = word.replace(f"{{{name}}}", path)
    return word


def _meanings(tmp_path: Path, cases: list[list[str]]) -> tuple[list[dict], list[dict], list[str], list[str]]:
    """Every case through fms's parser and through ours: (fms's, ours, fms's flags, those of
    fms's flags ours neither takes nor refuses with what to use instead)."""
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    results = str(tmp_path / "fms.json")
    fms = run_fms([str(MEANINGS), "fms", str(tmp_path / "cases.json"), results])
    assert fms.returncode == 0, fms.stderr[-3000:]
    ours_path = tmp_path / "ours.json"
    (tmp_path / "ours.json.flags").write_text(Path(results + ".flags").read_text())
    ours = run_trainer([sys.executable, str(MEANINGS), "ours", str(tmp_path / "cases.json"), str(ours_path)])
    assert ours.returncode == 0, ours.stderr[-3000:]
    return (json.loads(Path(results).read_text()), json.loads(ours_path.read_text()),
            json.loads(Path(results + ".flags").read_text()),
            json.loads((tmp_path / "ours.json.uncovered").read_text()))


@pytest.mark.slow  # imports transformers and trl twice: fms's pins and ours
def test_fms_and_our_parser_read_fms_command_lines_the_same(tmp_path: Path) -> None:
    where = _folders(tmp_path)
    cases = [[_fill(word, where) for word in argv] for argv in DOC_CASES.values()]
    remote = [*cases[0], "--tracker", "aim", "--aim_remote_server_ip", "127.0.0.1", "--aim_remote_server_port",
              "53800"]
    fms, ours, fms_flags, uncovered = _meanings(tmp_path, [*cases, remote])
    for name, argv, theirs, mine in zip(DOC_CASES, cases, fms, ours, strict=False):
        assert "meaning" in theirs, (name, theirs)
        assert "meaning" in mine, (name, mine)
        for key, value in theirs["meaning"].items():
            if key in GIVEN_ONLY and not set(GIVEN_ONLY[key]) & set(argv):
                continue
            assert mine["meaning"][key] == value, (name, key, value, mine["meaning"][key])
    # fms 3.2.2 builds the URL of --aim_remote_server_ip/--aim_remote_server_port by adding the int
    # port to a str, so its own documented remote form fails to parse; ours makes aim://IP:PORT.
    assert fms[-1]["error"].startswith("TypeError: can only concatenate str"), fms[-1]
    assert ours[-1]["meaning"]["aim_repo"] == "aim://127.0.0.1:53800", ours[-1]
    assert len(fms_flags) > 200 and not uncovered, f"fms flags neither taken nor refused: {uncovered}"


#: fms-hf-tuning flags we do not take, and flag values we refuse where fms goes on: (flags, the line).
REFUSED = [
    (["--quantization_method", "mxfp4"], "--quantization_method: quantized (MXFP4) models are not supported"),
    (["--peft_method", "pt"], "--peft_method pt: prompt tuning is not supported here; use --peft_method lora"),
    (["--peft_method", "alora", "--alora_invocation_string", "x"], "--peft_method alora: activated LoRA"),
    (["--bias", "all"], "--bias: a field of peft's LoraConfig that this trainer does not take; it takes --lora_r"),
    (["--data_config", "d.yaml"], "--data_config: data configs are not supported here; give --data_path"),
    (["--overwrite_output_dir"], "--overwrite_output_dir: transformers 5 removed it"),
    (["--tracker", "aim", "hf_resource_scanner"], "--tracker hf_resource_scanner: not supported here"),
    (["--exp_metadata", "{not json"], "--exp_metadata: invalid JSON"),
    (["--tracker", "aim", "--aim_remote_server_ip", "127.0.0.1"],
     "--aim_remote_server_ip and --aim_remote_server_port go together"),
    (["--tracker", "aim", "--aim_url", "http://127.0.0.1:53800"], "--aim_url: 'http://127.0.0.1:53800' is not"),
    (["--training_logs_filename", "logs/train.jsonl"], "--training_logs_filename: 'logs/train.jsonl' must be"),
    (["--dataset_text_field", "output", "--data_formatter_template", "{{input}}"],
     "--dataset_text_field and --data_formatter_template are both set"),
    (["--data_formatter_template", "{{missing}} ### Response: x"], "'missing' is undefined"),
    (["--torch_dtype", "float99"], "--torch_dtype: 'float99' is not a torch dtype"),
]


@pytest.mark.slow  # the trainer's imports (all cases in one process: tests/trainer_cases.py)
def test_unsupported_fms_flags_are_one_line_and_exit_2(tmp_path: Path) -> None:
    where = _folders(tmp_path)
    base = ["--model_name_or_path", where["model"], "--data_path", where["data"], "--output_dir", where["out"],
            "--response_template", "### Response:"]
    (tmp_path / "cases.json").write_text(json.dumps([{"argv": base + flags, "env": {}} for flags, _ in REFUSED]))
    done = subprocess.run([sys.executable, str(CASES), str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    for (flags, says), result in zip(REFUSED, results, strict=True):
        errors = error_lines(result["stderr"])
        assert result["status"] == 2 and len(errors) == 1, (flags, result["stderr"][-2000:])
        assert says in errors[0], (flags, errors[0])
        assert "ambiguous" not in errors[0] and "unrecognized" not in errors[0], errors[0]
    assert not Path(where["out"]).exists(), "refused before anything started"


@pytest.mark.slow  # trains (the demo, one rank) into a real `aim server`
def test_fms_remote_aim_flags_train_into_a_real_aim_server(aim_server, tmp_path: Path) -> None:
    aim_server.start()
    port = aim_server.url.rpartition(":")[2]
    out, exports = tmp_path / "out", tmp_path / "exports"
    done = run_trainer(TRAIN + [
        "--demo", "--output_dir", str(out), "--max_steps", "4", "--logging_steps", "1",
        "--tracker", "file_logger", "aim", "--aim_remote_server_ip", "127.0.0.1", "--aim_remote_server_port", port,
        "--aim_experiment", "fms-remote", "--run_uri_export_path", str(exports),
        "--training_logs_filename", "fms_logs.jsonl", "--exp_metadata", '{"gpu": "none"}',
        "--peft_method", "lora", "--r", "4", "--torch_dtype", "float32", "--use_flash_attn", "True",
        "--data_formatter_template", "### Instruction:\\n{{instruction}}\\n\\n### Response:\\n{{response}}{{eos_token}}"])
    assert done.returncode == 0, done.stderr[-3000:]
    off = [line for line in done.stderr.splitlines() if "--use_flash_attn: no CUDA device here" in line]
    assert len(off) == 1, done.stderr[-3000:]
    journal = read_jsonl(out / "fms_logs.jsonl")
    assert not (out / "training_logs.jsonl").exists()
    losses = {e["step"]: e["data"]["loss"] for e in journal
              if e["type"] == "metrics" and e.get("stage") == "train" and "loss" in e["data"]}
    assert sorted(losses) == [1, 2, 3, 4], losses
    peft = next(e["data"] for e in journal if e["type"] == "params" and e.get("stage") == "peft")
    assert peft["default"]["r"] == 4 and peft["default"]["lora_alpha"] == 16, peft  # --r, and ours default
    exported = json.loads((exports / "aim_tracker.json").read_text())
    assert exported["repo"] == aim_server.url and exported["experiment"] == "fms-remote", exported
    assert not (out / "aim_tracker.json").exists(), "--run_uri_export_path, not --output_dir"
    remote = _read_remote(aim_server.url)  # through the server, as any Aim client sees it
    assert [(r["hash"], r["experiment"]) for r in remote.values()] == [(exported["run_hash"], "fms-remote")]
    # A server's runs are indexed by `aim up` before their series and params can be read: as it does.
    aim_server.stop()
    index_like_aim_up(aim_server.path)
    runs = list(read_repo(str(aim_server.path)).values())
    assert [run.hash for run in runs] == [exported["run_hash"]]
    run = runs[0]
    assert run.params["experiment_metadata"] == {"gpu": "none"}
    assert run.series("loss") == losses


def _read_remote(url: str) -> dict[str, dict]:
    """The runs of the Aim server at ``url`` (hash, experiment), read through it as any
    Aim client reads them (tests/sink_readback.py), in a process of their own: Aim's remote client
    releases its handles at interpreter exit and, were the server gone by then, would wait forever."""
    code = ("import json, sys\nfrom sink_readback import read_repo\n"
            "print(json.dumps({run: {'hash': v.hash, 'experiment': v.experiment} "
            "for run, v in read_repo(sys.argv[1]).items()}))")
    done = subprocess.run([sys.executable, "-c", code, url], cwd=Path(__file__).resolve().parent,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_formatter_template_makes_each_text_and_the_tokenizers_tokens_go_in(tmp_path: Path) -> None:
    """fms's {{key}} template over each record, split at the response template, its {{eos_token}}
    filled from a real tokenizer once there is one; a token the tokenizer lacks is one line."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from trainer.dataset import load_sft_dataset
    from trainer.errors import UsageError
    from trainer.formatter import compile_template, fill_special_tokens

    data = tmp_path / "data.jsonl"
    data.write_text('{"input": "2 + 2", "output": "4"}\n{"input": "3 + 3", "output": "6"}\n')
    render = compile_template("### Input: {{input}}\n## Label: {{element['output']}}{{eos_token}}")
    ds = load_sft_dataset(str(data), "text", "\n## Label:", formatter=render)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                        eos_token="</s>")
    filled = fill_special_tokens(ds, tokenizer).to_list()
    assert filled == [{"prompt": "### Input: 2 + 2\n## Label:", "completion": " 4</s>"},
                      {"prompt": "### Input: 3 + 3\n## Label:", "completion": " 6</s>"}]
    padded = load_sft_dataset(str(data), "text", None, formatter=compile_template("{{input}}{{pad_token}}"))
    with pytest.raises(UsageError, match="uses {{pad_token}}, which the tokenizer does not have"):
        fill_special_tokens(padded, tokenizer)
    with pytest.raises(UsageError, match="record 1: --data_formatter_template: 'missing' is undefined"):
        load_sft_dataset(str(data), "text", None, formatter=compile_template("{{missing}}"))
    with pytest.raises(UsageError, match="--data_formatter_template: not a valid Jinja template"):
        compile_template("{{ unclosed")
