"""The SFT entry point: ``train()`` for Python callers and ``main()`` for the command line.

Order matters and is the point of this module: validate everything cheap first (exit 2, no
model loaded), then connect tracking (so the model load itself is measured and recorded), then
load, train, and at the end flush every rank before the embedded relay is stopped.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from trainer import custom_metrics
from trainer.args import DataArguments, ModelArguments, RunPlan, output_dir, parse_args, validate
from trainer.argv_rewrite import DEMO_DATA, DEMO_RESPONSE_TEMPLATE, demo_requested
from trainer.embedded import RelayStartError
from trainer.errors import UsageError
from trainer.formatter import fill_special_tokens
from trainer.job_tracking import JobPlace, JobTracking
from trainer.model_load import load_kwargs
from trainer.model_source import check_command_line
from trainer.stopping import STOP
from trainer.tracker_flags import TrackingArguments
from trainer.train_requirements import check_train_requirements
from trainer.usage import print_help

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
    from transformers.trainer_utils import TrainOutput
    from trl import SFTConfig

log = logging.getLogger("trainer")

DEMO_MODEL_DIR = "demo-model"
#: How long a rank other than 0 waits, after an error that stops the job, for the launcher to stop
#: it: rank 0 reads the same command line (or made the error), reports it once and exits, and
#: torchrun then stops the others. Only an error rank 0 did not hit (a path missing on one node)
#: is reported by its own rank.
PEER_ERROR_WAIT = 10.0


def _apply_demo(model: ModelArguments, data: DataArguments, training: SFTConfig) -> None:
    """--demo: the bundled data and a model built under output_dir, unless given explicitly."""
    if model.model_name_or_path is None:
        model.model_name_or_path = os.path.join(output_dir(training), DEMO_MODEL_DIR)
    if data.data_path is None:
        data.data_path = DEMO_DATA
        training.dataset_text_field = "output"
        if data.response_template is None:
            data.response_template = DEMO_RESPONSE_TEMPLATE


def _load(plan: RunPlan, rank: int) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Load tokenizer and model through from_pretrained, recording the time it took."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = plan.model
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name_or_path or plan.model_path)
    model = AutoModelForCausalLM.from_pretrained(plan.model_path, **load_kwargs(args))
    if rank == 0:
        custom_metrics.track({"model_load_time": time.perf_counter() - started})
    return tokenizer, model


def train(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: SFTConfig,
    tracking_args: TrackingArguments | None = None,
    callbacks: list[TrainerCallback] | None = None,
) -> TrainOutput:
    """Fine-tune as the command line does; with no ``tracking_args``, log to
    ``output_dir/training_logs.jsonl``.

    ``callbacks`` are added to the Trainer beside ours (another tracker to compare against, say).

    Raises UsageError (a ValueError) for bad arguments or data before any model is loaded, and
    RelayStartError if the embedded relay cannot start.
    """
    from peft import LoraConfig
    from trl import SFTTrainer

    from trainer.callback import RelayCallback
    from trainer.demo import build_demo

    if model_args.demo:
        _apply_demo(model_args, data_args, training_args)
    plan = validate(model_args, data_args, training_args, tracking_args)
    rank = training_args.process_index
    job: JobTracking | None = None
    relay_callback = None
    completed = False
    try:
        if plan.tracking_on:
            place = JobPlace(output_dir(training_args), rank, training_args.local_process_index,
                             training_args.world_size, training_args.run_name,
                             training_args.resume_from_checkpoint)
            job = JobTracking.open(place, plan.tracking, plan.trackers,
                                   exp_metadata=plan.exp_metadata)
        else:
            custom_metrics.disable()
        if model_args.demo:
            with training_args.main_process_first(local=True, desc="building the demo model"):
                build_demo(plan.model_path)
        tokenizer, model = _load(plan, rank)
        # its {{eos_token}}s, now the tokenizer is here
        if data_args.data_formatter_template is not None:
            plan.train_dataset = fill_special_tokens(plan.train_dataset, tokenizer)
            if plan.eval_dataset is not None:
                plan.eval_dataset = fill_special_tokens(plan.eval_dataset, tokenizer)
        peft_config = None
        if model_args.use_peft:
            targets = model_args.target_modules
            peft_config = LoraConfig(
                r=model_args.lora_r, lora_alpha=model_args.lora_alpha,
                lora_dropout=model_args.lora_dropout,
                target_modules="all-linear" if targets == ["all-linear"] else targets,
                task_type="CAUSAL_LM",
            )
        trainer = SFTTrainer(
            model=model, args=training_args, train_dataset=plan.train_dataset,
            eval_dataset=plan.eval_dataset, processing_class=tokenizer, peft_config=peft_config,
            callbacks=list(callbacks or []),
        )
        if plan.tracking_on:
            # Given the trainer, it times the waits in the collectives of the model the trainer
            # wraps (DDP, FSDP).
            relay_callback = RelayCallback(flush_timeout=plan.tracking.relay_flush_timeout,
                                           trainer=trainer,
                                           time_collectives=plan.tracking.time_collectives)
            trainer.add_callback(relay_callback)
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        completed = True
        return result
    except BaseException as exc:
        STOP.close()  # first: a SIGTERM must not cut the closing short (trainer/stopping.py)
        if job is not None:
            job.fail(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        STOP.close()
        if job is not None:
            # --relay_flush_timeout bounds the whole wait: closing gets what the callback's flush
            # left.
            job.close(None if relay_callback is None else relay_callback.flush_time_left,
                      completed=completed)


def _configure_logging() -> None:
    rank = int(os.environ.get("RANK", "0") or 0)
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_printed_by_its_library)


def _not_printed_by_its_library(record: logging.LogRecord) -> bool:
    """False for a record a library's own handler prints (huggingface_hub's): said twice."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None and logger is not logging.getLogger():
        if logger.handlers:
            return False
        if not logger.propagate:
            break
        logger = logger.parent
    return True


def main(argv: list[str] | None = None, callbacks: list[TrainerCallback] | None = None) -> int:
    """Command line entry point; returns the exit status (2: bad usage or input, 143: SIGTERM; 0 on
    a rank that torchrun stopped after rank 0 reported the job's error). ``callbacks``: as for
    train()."""
    argv = sys.argv[1:] if argv is None else list(argv)
    _configure_logging()
    # torchrun stops the surviving ranks with SIGTERM when one fails; unwinding (instead of dying
    # on the spot) lets train() publish the failure, flush, and stop the embedded relay.
    STOP.install()
    if demo_requested(argv):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # a model this small only loses by spreading out
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if any(word in ("-h", "--help") for word in argv):
        print_help()
        return 0
    try:
        check_train_requirements()
        check_command_line(argv)
        model_args, data_args, tracking_args, training_args = parse_args(argv)
        STOP.arm()  # a SIGTERM while the flags were read raises now, before any model loads
        train(model_args, data_args, training_args, tracking_args, callbacks)
    except UsageError as exc:
        return _fail(str(exc), 2, rank0_has_it=False)
    except RelayStartError as exc:
        return _fail(str(exc), 1, rank0_has_it=True)  # rank 0 made it and sent it to every rank
    finally:
        _close_process_group()
    return 0


def _fail(message: str, status: int, *, rank0_has_it: bool) -> int:
    """Report an error that stops the job in one line for the whole job, not one per rank.

    Rank 0 logs it and hands it to torchrun, whose failure summary then shows it instead of "To
    enable traceback see ...". Another rank first gives rank 0 time to fail: if torchrun stops it
    meanwhile (SIGTERM), rank 0 has reported, and it exits 0 so that the summary lists rank 0 alone;
    if the error came from rank 0, it exits quietly with ``status``; it speaks only when the error
    is its own.
    """
    rank = int(os.environ.get("RANK", "0") or 0)
    if rank != 0:
        if STOP.stopped_within(PEER_ERROR_WAIT):
            return 0
        if rank0_has_it:
            return status
        message = f"rank {rank}: {message}"
    log.error("%s", message)
    _write_error_file(message, status)
    return status


def _write_error_file(message: str, status: int) -> None:
    """Under torchrun (TORCHELASTIC_ERROR_FILE set), leave ``message`` where its failure summary
    looks for the cause, in the format of torch.distributed.elastic's own ErrorHandler."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    extra = {"timestamp": str(int(time.time()))}
    data = {"message": {"message": message, "errorCode": status, "extraInfo": extra}}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
    except OSError as exc:
        log.warning("cannot write torchrun's error file %s: %s", path, exc)


def _close_process_group() -> None:
    torch = sys.modules.get("torch")
    dist = None if torch is None else torch.distributed
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
