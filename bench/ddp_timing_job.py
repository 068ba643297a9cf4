"""One rank of the collective-timing benchmark (bench/bench_training.py runs it under torchrun on two
CPU ranks): the demo fine-tune under DDP, always on DDP's built-in all-reduce, whose collective timing
(trainer/collectives.py: gradients stamped, the backward pass and the blocking ``torch.distributed``
collectives wrapped) is attached and detached in turns of ``BLOCK`` steps, so drift hits both alike.
(Whole jobs, each timed or not from start to end: bench/bench_collectives.py.) Rank 0 writes each
mode's step cycle times (begin to begin) as JSON to ``OUT``.

    torchrun --nproc_per_node 2 bench/ddp_timing_job.py WORKDIR STEPS BLOCK OUT
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

PLAIN, TIMED, PLAIN_AGAIN = "nothing timed", "timed (trainer/collectives.py)", "nothing timed again (A/A: the noise floor)"
MODES = (PLAIN, TIMED, PLAIN_AGAIN, TIMED)


def demo_trainer(workdir: Path, steps: int) -> Any:
    """The demo fine-tune (LoRA) as an SFTTrainer on the CPU, every step logged, every batch the same
    shape (packed, so a step's cost does not depend on the rows it drew), without the printer."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from trainer.argv_rewrite import DEMO_DATA, DEMO_RESPONSE_TEMPLATE
    from trainer.dataset import load_sft_dataset
    from trainer.demo import build_demo

    torch.set_num_threads(1)
    config = SFTConfig(
        output_dir=str(workdir), max_steps=steps, logging_steps=1, per_device_train_batch_size=8, max_length=64,
        learning_rate=1e-2, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        activation_checkpointing=False, dataset_text_field="output", disable_tqdm=True,
        packing=True, packing_strategy="wrapped", ddp_find_unused_parameters=False,
    )
    with config.main_process_first(local=True):
        model_dir = build_demo(str(workdir / "demo-model"))
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir), args=config,
        train_dataset=load_sft_dataset(DEMO_DATA, "output", DEMO_RESPONSE_TEMPLATE),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def main(workdir: Path, steps: int, block: int, out: Path) -> None:
    from transformers import TrainerCallback

    from trainer import collectives

    timing: list[Any] = [None]  # collectives.Timing while timed
    mode = [PLAIN]
    cycles: dict[str, list[float]] = {name: [] for name in MODES}

    class Switch(TrainerCallback):
        """Installs both paths behind one switch, times each step cycle and picks the next step's mode."""

        last: float | None = None

        def __init__(self, trainer: Any) -> None:
            self.trainer = trainer

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now = time.perf_counter()
            if self.last is not None and state.global_step > len(MODES) * block:  # first round: warm-up
                cycles[mode[0]].append(now - self.last)
            self.last = now
            mode[0] = MODES[(state.global_step // block) % len(MODES)]
            if mode[0] == TIMED and timing[0] is None:
                timing[0] = collectives.attach(self.trainer)
            elif mode[0] != TIMED and timing[0] is not None:
                collectives.detach(self.trainer, timing[0])
                timing[0] = None
            if timing[0] is not None:
                timing[0].clock.take()
                timing[0].clock.in_step = True

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if timing[0] is not None:
                timing[0].clock.in_step = False

    trainer = demo_trainer(workdir, steps)
    trainer.add_callback(Switch(trainer))
    trainer.train()
    if trainer.args.process_index == 0:
        out.write_text(json.dumps({PLAIN: cycles[PLAIN], TIMED: cycles[TIMED], PLAIN_AGAIN: cycles[PLAIN_AGAIN]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
