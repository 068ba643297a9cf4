"""Command line and programmatic arguments of the SFT entry point, and their validation.

Everything a user can get wrong is checked here, before any model is loaded, so a typo costs
seconds rather than a model load; every failure is a :class:`UsageError` with one clear line.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from trainer import fms_flags
from trainer.argv_rewrite import RENAMED_FLAGS, has_flag, rewrite_argv
from trainer.errors import UsageError
from trainer.job_settings import check_tracking
from trainer.model_load import check_load_flags
from trainer.model_source import FLAGS, check_source
from trainer.tracker_flags import TrackingArguments

if TYPE_CHECKING:
    import datasets
    from transformers import HfArgumentParser
    from trl import SFTConfig

log = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model and tokenizer to fine-tune, and how (LoRA or full)."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Model folder or hub id."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or hub id (default: the model's)."}
    )
    use_peft: bool = field(
        default=False, metadata={"help": "Train LoRA adapters instead of all weights."}
    )
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (fms-hf-tuning's --r)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA path."})
    target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Modules that get LoRA adapters, space or comma separated (default: "
                          "peft's choice for the architecture), e.g. q_proj v_proj."},
    )
    torch_dtype: str | None = field(
        default=None,
        metadata={"help": "dtype the model is loaded in (from_pretrained's dtype): auto, float32, "
                          "bfloat16, float16 ... (default: from_pretrained's, the checkpoint's)."})
    use_flash_attn: bool = field(
        default=False,
        metadata={"help": "Load the model with flash_attention_2 (needs CUDA and flash-attn; "
                          "without CUDA it stays off, said in one line)."})
    demo: bool = field(
        default=False,
        metadata={"help": "Build the bundled tiny offline model, tokenizer and data set into "
                          "<output_dir>/demo-model and fine-tune it with LoRA on the CPU."},
    )


@dataclass
class DataArguments:
    """Where the instruction data is and which part of each text the loss is computed on."""

    data_path: str | None = field(
        default=None, metadata={"help": "Training data: a JSON or JSONL file."}
    )
    validation_data_path: str | None = field(
        default=None,
        metadata={"help": "Evaluation data (default: --validation_split of the training data)."},
    )
    validation_split: float = field(
        default=0.1,
        metadata={"help": "Fraction of the training data held out for evaluation when evaluation "
                          "is on and no --validation_data_path is given."},
    )
    response_template: str | None = field(
        default=None,
        metadata={"help": "Marker after which the response starts; the loss covers only what "
                          "follows it. Backslash escapes (\\n, \\t, \\\\) are interpreted, as "
                          "shells pass them literally."},
    )
    data_formatter_template: str | None = field(
        default=None,
        metadata={"help": "Jinja template that makes each record's text from its fields, as "
                          "fms-hf-tuning's: {{input}} ... {{output}}{{eos_token}} (instead of "
                          "--dataset_text_field)."})


@dataclass
class RunPlan:
    """Validated arguments plus what validation derived from them (data sets, sinks, metadata)."""

    model: ModelArguments
    data: DataArguments
    tracking: TrackingArguments
    training: SFTConfig
    trackers: list[str]
    exp_metadata: dict[str, Any] | None
    train_dataset: datasets.Dataset
    eval_dataset: datasets.Dataset | None

    @property
    def tracking_on(self) -> bool:
        return self.trackers != ["none"]

    @property
    def model_path(self) -> str:
        """--model_name_or_path, which ``validate`` requires (``--demo`` fills it in first)."""
        return _given(self.model.model_name_or_path, MODEL_REQUIRED)


MODEL_REQUIRED = "--model_name_or_path is required (or use --demo)"


def output_dir(training: SFTConfig) -> str:
    """--output_dir: TrainingArguments types it optional and fills in "trainer_output" if not
    given."""
    return _given(training.output_dir,
                  "--output_dir is required: the folder for checkpoints and the run's journal")


def _given(value: str | None, missing: str) -> str:
    if value is None:
        raise UsageError(missing)
    return value




def build_parser() -> HfArgumentParser:
    """The parser of our four argument dataclasses: every error a UsageError, and no abbreviated
    flags (argparse's prefix matching turned fms-hf-tuning's ``--r`` into "ambiguous option", and
    would let a flag added later change what an abbreviation means)."""
    from transformers import HfArgumentParser
    from transformers.hf_argparser import DataClassType
    from trl import SFTConfig

    class _Parser(HfArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(message)

    classes = (ModelArguments, DataArguments, TrackingArguments, SFTConfig)
    parser = _Parser([DataClassType(cls) for cls in classes], prog="metrics-relay-train",
                     allow_abbrev=False)
    _document_seed_flags(parser)
    return parser


def parse_args(argv: list[str]) -> tuple[ModelArguments, DataArguments, TrackingArguments,
                                         SFTConfig]:
    """Parse a command line into the four argument dataclasses; raise UsageError on any bad flag."""
    # trl's SFTConfig still sets the old name by default, so transformers warns on every run.
    warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated",
                            category=FutureWarning)
    if has_flag(argv, "--dataset_text_field") and has_flag(argv, "--data_formatter_template"):
        raise UsageError("--dataset_text_field and --data_formatter_template are both set: give "
                         "one (the template makes each record's text)")
    argv = rewrite_argv(argv)
    if not has_flag(argv, "--use_cpu") and _cpu_only():
        argv = ["--use_cpu", "True", *argv]
    parser = build_parser()
    # Flags first, dataclasses after: under torchrun, making SFTConfig starts torch.distributed
    # (gloo), and a rank that stopped at a bad flag then could leave its peer in gloo's connection
    # set-up, failing too.
    rest = parser.parse_known_args(argv)[1]
    if rest:
        refusal = next((line for word in rest if (line := fms_flags.unsupported(word))), None)
        raise UsageError(refusal or f"unrecognized arguments: {' '.join(rest)}")
    try:
        model, data, tracking, training = parser.parse_args_into_dataclasses(args=argv)
    except (ValueError, TypeError) as exc:
        raise UsageError(_one_line(exc)) from None
    return model, data, tracking, training


def _document_seed_flags(parser: argparse.ArgumentParser) -> None:
    """List the seed's flag names in --help; rewrite_argv has mapped them before parsing, so they
    never reach the parser (SUPPRESS keeps them out of the parsed arguments)."""
    group = parser.add_argument_group("the seed's flag names (still accepted)")
    for old, new in RENAMED_FLAGS.items():
        if "-" not in old[2:]:  # the underscore spelling; the dashed one is accepted as well
            note = " (a value below 1 is a ratio)" if old == "--warmup_ratio" else ""
            group.add_argument(old, metavar=new[2:].upper(), default=argparse.SUPPRESS,
                               help=f"same as {new}{note}")


def _cpu_only() -> bool:
    """No accelerator: ``use_cpu`` is implied, else bf16 (trl's default) refuses to start."""
    import torch

    return not torch.accelerator.is_available()


def sft_config(**kwargs: Any) -> SFTConfig:
    """``trl.SFTConfig(**kwargs)`` as the command line makes it, for ``train()`` callers: with no
    accelerator, ``use_cpu=True`` unless given (a bare SFTConfig raises on a CPU-only machine)."""
    from trl import SFTConfig

    if "use_cpu" not in kwargs and _cpu_only():
        kwargs["use_cpu"] = True
    return SFTConfig(**kwargs)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def unescape(text: str) -> str:
    r"""Interpret \n, \t and \\ the way the seed's users typed them in a shell."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


#: What ``--resume_from_checkpoint`` takes for "the last checkpoint in --output_dir" (as
#: Trainer.train(True)).
LAST_CHECKPOINT = ("true", "last")


def _resume_args(training: SFTConfig, tracking: TrackingArguments) -> None:
    """``--resume_from_checkpoint True`` (or ``last``) becomes the last checkpoint in --output_dir,
    and a checkpoint that is not a folder, a run to continue that is not a run id, or both run flags
    at once are usage errors (the run a resumed job continues: trainer/run_identity.py)."""
    spec = training.resume_from_checkpoint
    if spec is not None and spec.lower() in LAST_CHECKPOINT:
        from transformers.trainer_utils import get_last_checkpoint

        folder = output_dir(training)
        found = get_last_checkpoint(folder) if os.path.isdir(folder) else None
        if found is None:
            raise UsageError(f"--resume_from_checkpoint {spec}: no checkpoint-N folder in "
                             f"--output_dir {training.output_dir}; name the checkpoint to "
                             "resume from")
        training.resume_from_checkpoint = found
    elif spec is not None and not os.path.isdir(spec):
        raise UsageError(f"--resume_from_checkpoint: {spec} is not a folder (a checkpoint-N "
                         "folder, or True for the last one in --output_dir)")
    if tracking.continue_run is not None:
        if tracking.new_run:
            raise UsageError("--continue_run and --new_run contradict each other: give one")
        from relay.wire.schema import RUN_ID_RE, valid_run_id

        if not valid_run_id(tracking.continue_run):
            raise UsageError(f"--continue_run: {tracking.continue_run!r} must match "
                             f"{RUN_ID_RE.pattern}")


def validate(
    model: ModelArguments,
    data: DataArguments,
    training: SFTConfig,
    tracking: TrackingArguments | None = None,
) -> RunPlan:
    """Check everything that does not need the model; load and split the data set.

    ``model`` and ``data`` are filled in for --demo by the caller before this runs.
    """
    from trainer.dataset import load_sft_dataset

    tracking = tracking or TrackingArguments()
    trackers, exp_metadata = check_tracking(tracking)
    if training.fsdp and _cpu_only() and training.process_index == 0:
        log.warning("--fsdp: no accelerator here, so accelerate runs this job as plain data "
                    "parallel (DDP on gloo, the whole model on every rank), not sharded")
    _resume_args(training, tracking)
    if training.run_name is not None:
        from relay.wire.schema import RUN_ID_RE, valid_run_id

        if not valid_run_id(training.run_name):
            raise UsageError(f"--run_name: {training.run_name!r} must match {RUN_ID_RE.pattern}")
    if not model.model_name_or_path:
        raise UsageError(MODEL_REQUIRED)
    for flag in FLAGS:
        path = getattr(model, flag)
        if model.demo and flag == "model_name_or_path":
            continue  # --demo builds it there
        if path:
            check_source(flag, path)
    if model.target_modules:
        model.target_modules = [m for spec in model.target_modules for m in spec.split(",") if m]
    if not model.use_peft and model.target_modules:
        raise UsageError("--target_modules needs --use_peft (--peft_method lora)")
    check_load_flags(model, rank0=training.process_index == 0)
    if model.lora_r < 1 or model.lora_alpha < 1:
        raise UsageError("--lora_r and --lora_alpha must be positive")
    if not 0 < data.validation_split < 1:
        raise UsageError(f"--validation_split must be in (0, 1), got {data.validation_split}")
    if not data.data_path:
        raise UsageError("--data_path is required (or use --demo)")
    if data.response_template is not None:
        data.response_template = unescape(data.response_template)
        if not data.response_template:
            raise UsageError("--response_template is empty")
    formatter = None
    if data.data_formatter_template is not None:
        from trainer.formatter import compile_template

        data.data_formatter_template = unescape(data.data_formatter_template)
        formatter = compile_template(data.data_formatter_template)
    text_field = training.dataset_text_field
    train_ds = load_sft_dataset(data.data_path, text_field, data.response_template, "--data_path",
                                formatter)
    eval_ds = None
    if training.eval_strategy != "no":
        if data.validation_data_path:
            eval_ds = load_sft_dataset(data.validation_data_path, text_field,
                                       data.response_template, "--validation_data_path", formatter)
        else:
            if len(train_ds) < 2:
                raise UsageError(
                    "--data_path: evaluation needs at least 2 records to hold some out")
            split = train_ds.train_test_split(test_size=data.validation_split, seed=training.seed)
            train_ds, eval_ds = split["train"], split["test"]
    return RunPlan(model, data, tracking, training, trackers, exp_metadata, train_ds, eval_ds)
