"""What each of several command lines means to a parser: fms-hf-tuning 3.2.2's (run in the
compatibility venv) or ours (``python -m trainer``'s parsing and validation), for
tests/test_fms_flags.py:

    flag_meanings.py fms|ours CASES.json RESULTS.json

CASES is a list of argument lists; RESULTS gets, in the same order, ``{"meaning": {...}}`` with the
same keys from either side (model, data, LoRA, trackers, Aim, export path, journal name, metadata,
training numbers), or ``{"error": "Type: message"}`` where the parser refused the command line.
The fms side also writes every flag fms's parser takes to ``RESULTS.flags``; ours then reads it and
writes to ``RESULTS.uncovered`` those it neither takes nor refuses with what to use instead.
"""
from __future__ import annotations

import json
import sys
from typing import Any

#: fms-hf-tuning's trackers in our names (file_logger is our journal).
OUR_TRACKER = {"file_logger": "jsonl"}


def _lora(method_is_lora: bool, r: int, alpha: int, dropout: float, targets: Any) -> dict[str, Any]:
    if not method_is_lora:
        return {"peft": False}
    if isinstance(targets, (list, set, tuple)):
        targets = sorted(targets)
    return {"peft": True, "r": r, "lora_alpha": alpha, "lora_dropout": dropout, "target_modules": targets}


def fms_meaning(argv: list[str]) -> dict[str, Any]:
    from tuning import sft_trainer
    from tuning.config.peft_config import LoraConfig

    sys.argv = ["sft_trainer.py", *argv]
    (model, data, training, _controller, tune, _quant, _qlora, _fused, _aadp, _moe, trackers,
     metadata) = sft_trainer.parse_arguments(sft_trainer.get_parser())
    lora = isinstance(tune, LoraConfig)
    names = {OUR_TRACKER.get(n, n) for n in [*(training.trackers or []), "file_logger"]}  # always on
    aim = trackers.aim_url or trackers.aim_repo
    return {
        "model": model.model_name_or_path, "tokenizer": model.tokenizer_name_or_path,
        "data": data.training_data_path, "text_field": data.dataset_text_field,
        "response_template": data.response_template, "formatter": data.data_formatter_template,
        **_lora(lora, *(tune.r, tune.lora_alpha, tune.lora_dropout, tune.target_modules) if lora else (0, 0, 0, 0)),
        "trackers": sorted(names), "aim_experiment": trackers.aim_experiment,
        "mlflow_experiment": trackers.mlflow_experiment,
        "aim_repo": aim.rstrip("/") if aim else None, "export_path": trackers.run_uri_export_path,
        "logs_filename": trackers.training_logs_filename,
        "exp_metadata": json.dumps(json.loads(metadata)) if metadata is not None else None,
        "torch_dtype": str(model.torch_dtype).removeprefix("torch."), "flash_attn": model.use_flash_attn,
        **_training(training),
    }


def ours_meaning(argv: list[str]) -> dict[str, Any]:
    from trainer.args import parse_args, validate
    from trainer.tracker_flags import DEFAULT_PROJECT, aim_experiment, aim_remote

    model, data, tracking, training = parse_args(argv)
    flash_attn = model.use_flash_attn  # as given: validation turns it off without CUDA, saying so
    plan = validate(model, data, training, tracking)
    t = plan.tracking
    return {
        "model": model.model_name_or_path, "tokenizer": model.tokenizer_name_or_path,
        "data": data.data_path, "text_field": None if data.data_formatter_template else training.dataset_text_field,
        "response_template": data.response_template, "formatter": data.data_formatter_template,
        **_lora(model.use_peft, model.lora_r, model.lora_alpha, model.lora_dropout,
                "all-linear" if model.target_modules == ["all-linear"] else model.target_modules),
        "trackers": sorted(plan.trackers), "aim_experiment": aim_experiment(t),
        "mlflow_experiment": t.mlflow_experiment or t.experiment or DEFAULT_PROJECT,
        "aim_repo": aim_remote(t) or t.aim_repo, "export_path": t.run_uri_export_path,
        "logs_filename": t.training_logs_filename,
        "exp_metadata": json.dumps(plan.exp_metadata) if plan.exp_metadata is not None else None,
        "torch_dtype": model.torch_dtype, "flash_attn": flash_attn, **_training(training),
    }


def _training(training: Any) -> dict[str, Any]:
    return {name: getattr(training, name) for name in (
        "output_dir", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
        "learning_rate", "logging_steps", "lr_scheduler_type", "logging_strategy", "save_strategy")}


def uncovered(fms_flags: list[str]) -> list[str]:
    """fms-hf-tuning's flags that our parser neither takes nor refuses with what to use instead."""
    from trainer.args import build_parser
    from trainer.argv_rewrite import ALIASES, PEFT_METHOD
    from trainer.fms_flags import FMS_SWITCHES, unsupported

    ours = {o for a in build_parser()._actions for o in a.option_strings}
    ours |= {*ALIASES, PEFT_METHOD, *FMS_SWITCHES}
    return [flag for flag in fms_flags if flag not in ours and unsupported(flag) is None]


def main(side: str, cases_path: str, results_path: str) -> None:
    meaning = fms_meaning if side == "fms" else ours_meaning
    results = []
    with open(cases_path, encoding="utf-8") as fh:
        cases = json.load(fh)
    for argv in cases:
        try:
            results.append({"meaning": meaning(argv)})
        except (Exception, SystemExit) as exc:  # the parser's refusal is the result
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    if side == "fms":
        from tuning import sft_trainer

        parser = sft_trainer.get_parser()
        flags = sorted({o for a in parser._actions for o in a.option_strings
                        if o.startswith("--") and "-" not in o[2:]})
        with open(results_path + ".flags", "w", encoding="utf-8") as fh:
            json.dump(flags, fh)
    else:
        with open(results_path + ".flags", encoding="utf-8") as fh:
            missing = uncovered(json.load(fh))
        with open(results_path + ".uncovered", "w", encoding="utf-8") as fh:
            json.dump(missing, fh)
    with open(results_path, "w", encoding="utf-8") as fh:
        json.dump(results, fh, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:4])
