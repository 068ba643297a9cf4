"""fms-hf-tuning 3.2.2's flag names on our command line, and a one-line answer for those we lack.

fms users type ``--training_data_path``, ``--r 8``, ``--peft_method lora`` and ``--trackers aim
mlflow``; here they mean what they mean there, mapped onto our flags before parsing (as the seed's
renamed flags are, trainer/args.py). A flag of fms's that we do not support is refused with what
to use instead, never argparse's "unrecognized" or "ambiguous option" (docs/trainer.md lists what
we deliberately do differently).
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

from trainer.errors import UsageError

#: fms-hf-tuning's flag -> ours, same meaning (``--tracker`` is fms's abbreviation of
#: ``--trackers``).
FMS_ALIASES = {
    "--trackers": "--tracker",
    "--training_data_path": "--data_path",
    "--r": "--lora_r",
}
#: ``--peft_method`` values -> ``--use_peft`` values (fms lower-cases them: ``"None"`` is none).
PEFT_METHODS = {"lora": "True", "none": "False"}
#: fms's tracker names that are ours under another name.
TRACKER_ALIASES = {"file_logger": "jsonl"}

_LORA = "it takes --lora_r (--r), --lora_alpha, --lora_dropout and --target_modules"
_ONE_TEXT = ("give --data_path (JSON or JSONL) with --dataset_text_field or "
             "--data_formatter_template")
_ACCELERATION = "fms-acceleration's plugins are not supported here; drop the flag"
_NO_PREPROCESSING = ("offline data processing is not supported here; fms-hf-tuning's own trainer "
                     "does it")
#: fms-hf-tuning 3.2.2 flags this trainer does not take -> what to use instead.
FMS_UNSUPPORTED = {
    "--peft_method pt": "prompt tuning is not supported here; use --peft_method lora (or none)",
    "--peft_method alora": "activated LoRA is not supported here; use --peft_method lora (or none)",
    "--alora_invocation_string": "activated LoRA is not supported here; use --peft_method lora",
    "--prompt_tuning_init": "prompt tuning is not supported here; use --peft_method lora",
    "--prompt_tuning_init_text": "prompt tuning is not supported here; use --peft_method lora",
    "--num_virtual_tokens": "prompt tuning is not supported here; use --peft_method lora",
    "--quantization_method": "quantized (MXFP4) models are not supported here; train an "
                             "unquantized one",
    "--dequantize": "quantized (MXFP4) models are not supported here; train an unquantized one",
    "--auto_gptq": "QLoRA is not supported here; use --peft_method lora on an unquantized model",
    "--bnb_qlora": "QLoRA is not supported here; use --peft_method lora on an unquantized model",
    "--fused_lora": _ACCELERATION,
    "--fast_kernels": _ACCELERATION,
    "--multipack": _ACCELERATION,
    "--fast_moe": _ACCELERATION,
    "--data_config_path": f"data configs are not supported here; {_ONE_TEXT}",
    "--data_config": f"data configs are not supported here; {_ONE_TEXT}",
    "--chat_template": f"chat data is not supported here; {_ONE_TEXT} and --response_template",
    "--instruction_template": f"chat data is not supported here; {_ONE_TEXT} and "
                              "--response_template",
    "--dataset_conversation_field": f"chat data is not supported here; {_ONE_TEXT}",
    "--dataset_image_field": "vision models are not supported here; fine-tune a causal language "
                             "model",
    "--add_special_tokens": "adding tokens is not supported here; use a tokenizer that has them "
                            "(--tokenizer_name_or_path)",
    "--do_dataprocessing_only": _NO_PREPROCESSING,
    "--num_train_dataset_shards": _NO_PREPROCESSING,
    "--num_eval_dataset_shards": _NO_PREPROCESSING,
    "--embedding_size_multiple_of": "resizing the embeddings is not supported here; drop the flag",
    "--flash_attn_implementation": "use --use_flash_attn True (flash_attention_2) or leave the "
                                   "model's default attention",
    "--save_model_dir": "the model is saved into --output_dir; copy it from there",
    "--enable_reduce_loss_sum": "the loss is trl's mean here; drop the flag",
    "--trainer_controller_config_file": "trainer controllers are not supported here; add a "
                                        "callback from Python instead (train(..., "
                                        "callbacks=[...]))",
    "--scanner_output_filename": "the hf_resource_scanner tracker is not supported here: every "
                                 "rank's memory and step time are in the journal "
                                 "(docs/watching.md)",
    "--cache_dir": "set HF_HOME (or HF_HUB_CACHE) for where models are cached",
    "--tracker hf_resource_scanner": "not supported here: every rank's memory and step time are "
                                     "in the journal already (docs/watching.md)",
}
_GONE = "transformers 5 removed it (fms-hf-tuning 3.2.2 runs transformers 4.55)"
#: TrainingArguments flags of transformers 4.55 (fms-hf-tuning's) that transformers 5 removed.
FMS_UNSUPPORTED.update({flag: f"{_GONE}; {instead}" for flag, instead in {
    "--overwrite_output_dir": "the trainer writes into --output_dir as it is",
    "--logging_dir": "use --tensorboard_logdir for TensorBoard's folder",
    "--no_cuda": "use --use_cpu True",
    "--use_mps_device": "it uses the MPS device when there is one",
    "--per_gpu_train_batch_size": "use --per_device_train_batch_size",
    "--per_gpu_eval_batch_size": "use --per_device_eval_batch_size",
    "--push_to_hub_model_id": "use --hub_model_id",
    "--push_to_hub_organization": "use --hub_model_id ORG/NAME",
    "--push_to_hub_token": "use --hub_token",
    "--fp16_backend": "use --fp16 True or --bf16 True",
    "--half_precision_backend": "use --fp16 True or --bf16 True",
    "--fp16_opt_level": "use --fp16 True or --bf16 True",
    "--adafactor": "use --optim adafactor",
    "--fsdp_min_num_params": "use --fsdp_config",
    "--fsdp_transformer_layer_cls_to_wrap": "use --fsdp_config",
    "--group_by_length": "use --train_sampling_strategy group_by_length",
    "--include_inputs_for_metrics": "use --include_for_metrics inputs",
    "--include_tokens_per_second": "use --include_num_input_tokens_seen",
    "--torchdynamo": "use --torch_compile_backend",
    "--save_safetensors": "checkpoints are always safetensors",
    "--no_save_safetensors": "checkpoints are always safetensors",
    **dict.fromkeys((
        "--jit_mode_eval", "--mp_parameters", "--past_index", "--ray_scope", "--tpu_metrics_debug",
        "--tpu_num_cores", "--use_ipex", "--use_legacy_prediction_loop"), "drop the flag"),
}.items()})
#: fms-hf-tuning's ``--no_`` switches of a flag that is on there by default and off here.
FMS_SWITCHES = {"--no_use_flash_attn": ["--use_flash_attn", "False"]}


def unsupported(flag: str) -> str | None:
    """The line that refuses fms-hf-tuning's ``flag`` (``--name``), or None if fms has no such
    flag."""
    name = flag.partition("=")[0]
    if name in FMS_UNSUPPORTED:
        return f"{name}: {FMS_UNSUPPORTED[name]}"
    # a yes/no flag's --no_ form
    if name.startswith("--no_") and f"--{name[5:]}" in FMS_UNSUPPORTED:
        return f"{name}: {FMS_UNSUPPORTED['--' + name[5:]]}"
    if name[2:].removeprefix("no_") in _lora_fields():
        return f"{name}: a field of peft's LoraConfig that this trainer does not take; {_LORA}"
    return None


@lru_cache(maxsize=1)
def _lora_fields() -> frozenset[str]:
    """peft's LoraConfig fields: fms-hf-tuning takes each as a flag (its LoraConfig extends
    peft's)."""
    from peft import LoraConfig

    return frozenset(f.name for f in dataclasses.fields(LoraConfig))


def peft_method(value: str) -> str:
    """``--peft_method VALUE`` -> the ``--use_peft`` value it means; UsageError for one we lack."""
    method = value.strip().lower()
    if method in PEFT_METHODS:
        return PEFT_METHODS[method]
    known = f"--peft_method {method}"
    if known in FMS_UNSUPPORTED:
        raise UsageError(f"{known}: {FMS_UNSUPPORTED[known]}")
    raise UsageError(f"--peft_method: {value!r} is not one of lora, none")


def tracker_name(name: str) -> str:
    """fms's tracker name -> ours (``file_logger`` is the journal); UsageError for one we lack."""
    known = f"--tracker {name}"
    if known in FMS_UNSUPPORTED:
        raise UsageError(f"{known}: {FMS_UNSUPPORTED[known]}")
    return TRACKER_ALIASES.get(name, name)
