"""Training overhead: the demo fine-tune with tracking off, with the embedded relay, and with Aim's
own in-process ``AimCallback`` instead.

The contenders are the real command (``torchrun --nproc_per_node 2 -m trainer --demo``, two CPU
ranks) with ``--logging_steps 1``; for Aim, the same job with ``AimCallback`` added and
``--tracker none`` (bench/aim_job.py). They run alternately in one invocation so machine drift
hits all alike. The main figure is the Trainer's own ``train_runtime`` (the training loop,
callbacks included); the whole process's wall time, which also pays for starting and stopping
the relay, is reported beside it.

On a shared machine the spread of whole jobs is wider than the effect, so two finer
measurements follow. Interleaved blocks: one demo job whose tracking is switched between off,
our relay callback and AimCallback every few steps, so drift cancels, and every step's full cycle
(data, compute, callbacks, logging, and the competition from the publisher's I/O thread, the relay
process, or Aim's threads) is timed. Hooks: our callback's own hooks for one logged step, driving
the real callback and a real publisher connected to a real relay, against the demo's median step
time. Collective timing: a two-rank DDP job (bench/ddp_timing_job.py, DDP's built-in all-reduce)
whose collective timing (trainer/collectives.py) is attached and detached in turns, step cycles
compared in the same run.

``--quick`` (the smoke test, tests/test_bench_smoke.py) keeps every part but shrinks it: one round of
10-step whole jobs on one rank each (still ``torchrun`` and the contenders' real commands: a launch
costs its processes' imports, some 6 CPU-s a rank, whatever the steps), 100-step interleaved and
50-step collective-timing jobs (two ranks: DDP's all-reduce needs them; fewer steps saved nothing
measurable, their cost too is their processes' start). ``main``'s ``launch`` runs each
torchrun command line: real ``torchrun`` by default; the smoke test passes its warm ranks'
(tests/warm_ranks.py: torch's own launcher, from a process that imported torch and the
trainer's libraries once).

    python -m bench.bench_training [--steps 200] [--rounds 7] [--quick] [--collectives-only] [--json FILE]
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import ROOT, RelayRun, Sample, alternate, free_port, machine, table
from relay.wire.address import ADDRESS_ENV
from trainer.custom_metrics import SEND_INTERVAL

OFF, RELAY, AIM = "tracking off", "relay on", "AimCallback in-process"
OFF_AGAIN = "tracking off again (A/A: the noise floor)"
INTERLEAVED = 10  # the interleaved job runs this many times --steps
#: --quick: steps of a whole job, rounds, ranks of a whole job.
QUICK = {"steps": 10, "rounds": 1, "ranks": 1}
#: The job each contender runs (after torchrun's own flags), given its output folder.
JOBS: dict[str, Callable[[Path], list[str]]] = {
    OFF: lambda out: ["-m", "trainer", "--tracker", "none"],
    RELAY: lambda out: ["-m", "trainer", "--tracker", "jsonl"],
    AIM: lambda out: ["-m", "bench.aim_job", str(out / "aim"), "--tracker", "none"],
}


#: Runs ``torchrun ARGV`` with an environment and a timeout, its output captured as text.
Launch = Callable[[list[str], dict[str, str], float], "subprocess.CompletedProcess[str]"]


def torchrun(argv: list[str], env: dict[str, str],
             timeout: float) -> subprocess.CompletedProcess[str]:
    """The real ``torchrun ARGV``, in the checkout."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _launched(launch: Launch, cmd: list[str], env: dict[str, str],
              timeout: float) -> subprocess.CompletedProcess[str]:
    """``launch``'s run of ``torchrun cmd``; raises with its stderr's end if it failed."""
    done = launch(cmd, env, timeout)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun {' '.join(cmd)} exited {done.returncode}:\n"
                           f"{done.stderr[-2000:]}")
    return done


def _run(steps: int, contender: str, workdir: Path, wall: Sample, ranks: int,
         launch: Launch) -> float:
    """One demo job on ``ranks`` CPU ranks; returns its train_runtime and appends the process wall time to ``wall``."""
    out = workdir / f"{contender.split()[0]}-{time.monotonic_ns()}"
    runtime, seconds = demo_job(JOBS[contender](out), steps, out, ranks, launch)
    wall.values.append(seconds)
    return runtime


def demo_job(job: list[str], steps: int, out: Path, ranks: int = 2,
             launch: Launch = torchrun) -> tuple[float, float]:
    """The demo fine-tune on ``ranks`` CPU ranks (torchrun, then ``job``: ``-m trainer ...``) writing into
    ``out``: its train_runtime and the whole process's wall time."""
    cmd = ["--nnodes=1", f"--nproc_per_node={ranks}", f"--master_port={free_port()}", *job,
           "--demo", "--output_dir", str(out), "--max_steps", str(steps), "--logging_steps", "1",
           "--disable_tqdm", "True"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop(ADDRESS_ENV, None)
    started = time.perf_counter()
    done = _launched(launch, cmd, env, 600)
    seconds = time.perf_counter() - started
    for line in done.stdout.splitlines():
        if "'train_runtime'" in line:
            return float(ast.literal_eval(line.strip())["train_runtime"]), seconds
    raise RuntimeError(f"no train_runtime in the output of torchrun {' '.join(cmd)}")


def interleaved(steps: int, block: int, workdir: Path) -> dict[str, Sample]:
    """Step cycle times of one demo job whose tracking goes off, relay, off, Aim, off, ... every ``block``
    steps; the second "off" is an A/A control that shows how far two identical modes drift apart."""
    import torch
    from aim.hugging_face import AimCallback
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from relay.client.publisher import Publisher
    from trainer.argv_rewrite import DEMO_DATA, DEMO_RESPONSE_TEMPLATE
    from trainer.callback import RelayCallback
    from trainer.dataset import load_sft_dataset
    from trainer.demo import build_demo
    from trainer.embedded import EmbeddedRelay

    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 does for the whole jobs
    folder = workdir / "interleaved"
    model_dir = build_demo(str(folder / "demo-model"))
    modes = (OFF, RELAY, OFF_AGAIN, AIM)
    samples = {mode: Sample(f"{mode} (interleaved blocks)", "s") for mode in modes}
    current = [OFF]

    class GatedRelay(RelayCallback):
        def on_step_begin(self, *args: object, **kwargs: object) -> None:
            if current[0] == RELAY:
                super().on_step_begin(*args, **kwargs)

        def on_step_end(self, *args: object, **kwargs: object) -> None:
            if current[0] == RELAY:
                super().on_step_end(*args, **kwargs)

        def on_log(self, *args: object, **kwargs: object) -> None:
            if current[0] == RELAY:
                super().on_log(*args, **kwargs)

    class GatedAim(AimCallback):
        def on_log(self, *args: object, **kwargs: object) -> None:
            if current[0] == AIM:
                super().on_log(*args, **kwargs)

    class Cycle(TrainerCallback):
        """Times begin-to-begin (the whole cycle of the previous step) and sets the next step's mode."""

        last = None

        def on_step_begin(self, args: object, state: object, control: object, **kwargs: object) -> None:
            now = time.perf_counter()
            if self.last is not None and state.global_step > len(modes) * block:  # first round: warm-up
                samples[current[0]].values.append(now - self.last)
            self.last = now
            current[0] = modes[(state.global_step // block) % len(modes)]

    relay = EmbeddedRelay.start(str(folder))
    pub = Publisher("bench-interleaved", 0, address=relay.address, send_interval=SEND_INTERVAL)
    try:
        config = SFTConfig(
            output_dir=str(folder), max_steps=steps, logging_steps=1, per_device_train_batch_size=8, max_length=64,
            learning_rate=1e-2, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
            activation_checkpointing=False, dataset_text_field="output", disable_tqdm=True,
            # Every batch the same shape (the demo's rows differ in length), so that a step's cost does
            # not depend on which rows it drew and the modes compare like with like.
            packing=True, packing_strategy="wrapped",
        )
        trainer = SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir), args=config,
            train_dataset=load_sft_dataset(DEMO_DATA, "output", DEMO_RESPONSE_TEMPLATE),
            processing_class=AutoTokenizer.from_pretrained(model_dir), peft_config=LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM"),
            callbacks=[Cycle(), GatedRelay(pub), GatedAim(repo=str(folder / "aim"), experiment="bench-interleaved",
                                                          log_system_params=False)],
        )
        trainer.remove_callback(PrinterCallback)  # the log dicts on stdout
        trainer.train()
        if pub.close(30) != 0:
            raise RuntimeError("the relay did not acknowledge every benchmark event")
    finally:
        relay.stop()
    return samples


def collective_timing(steps: int, block: int, workdir: Path,
                      launch: Launch = torchrun) -> dict[str, Sample]:
    """Step cycle times of a two-rank DDP job by mode (bench/ddp_timing_job.py): nothing timed, timed,
    nothing timed again."""
    folder, result = workdir / "collectives", workdir / "collectives.json"
    cmd = ["--nnodes=1", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(ROOT / "bench" / "ddp_timing_job.py"), str(folder), str(steps), str(block), str(result)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    _launched(launch, cmd, env, 1800)
    return {mode: Sample(f"{mode} (interleaved, 2 ranks)", "s", values)
            for mode, values in json.loads(result.read_text()).items()}


def _print_timing(timing: dict[str, Sample], steps: int) -> list[dict]:
    plain, *others = timing.values()
    rows = [plain.row(), *(sample.row(plain) for sample in others)]
    print("\n" + table(rows, f"Collective timing: one DDP job on 2 CPU ranks, {steps} steps, "
                             "nothing timed / timed in turns, wall time per step cycle"))
    return rows


def hook_cost(steps: int, workdir: Path) -> Sample:
    """Wall time of the callback's hooks for one logged step (step begin, step end, on_log)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from relay.client.publisher import Publisher
    from trainer.callback import RelayCallback

    relay = RelayRun(workdir / "hooks", ["--path", str(workdir / "hooks" / "journal.jsonl")])
    pub = Publisher("bench-hooks", 0, address=relay.address, send_interval=SEND_INTERVAL)
    try:
        callback = RelayCallback(pub)
        args = TrainingArguments(output_dir=str(workdir / "hooks"), use_cpu=True, report_to="none")
        state, control = TrainerState(max_steps=steps, is_world_process_zero=True), TrainerControl()
        callback.on_train_begin(args, state, control)
        logs = {"loss": 2.5, "grad_norm": 0.4, "learning_rate": 1e-3, "entropy": 6.2,
                "mean_token_accuracy": 0.1, "num_tokens": 1000.0, "epoch": 0.1}
        sample = Sample("callback hooks per logged step", "s")
        for _ in range(steps):
            started = time.perf_counter()
            callback.on_step_begin(args, state, control)
            state.global_step += 1
            control.should_log = True
            callback.on_step_end(args, state, control)
            callback.on_log(args, state, control, logs=dict(logs))
            sample.values.append(time.perf_counter() - started)
        if pub.close(30) != 0:
            raise RuntimeError("the relay did not acknowledge every benchmark event")
    finally:
        relay.stop()
    return sample


def main(argv: list[str] | None = None, launch: Launch = torchrun) -> int:
    """Alternate the three contenders' demo jobs; print medians, spread and the ratios. ``launch``
    runs each torchrun command line (the whole jobs' and the collective timing job's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200,
                        help=f"training steps per job (x{INTERLEAVED} for the interleaved job)")
    parser.add_argument("--rounds", type=int, default=7, help="jobs per contender")
    parser.add_argument("--quick", action="store_true", help="1 round of 10 steps on 1 rank (a smoke test)")
    parser.add_argument("--collectives-only", action="store_true",
                        help=f"only the collective timing job ({INTERLEAVED // 2} x --steps steps)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    steps, rounds, ranks = (QUICK["steps"], QUICK["rounds"], QUICK["ranks"]) if args.quick else (
        args.steps, args.rounds, 2)
    interleaved_steps, timing_steps = steps * INTERLEAVED, steps * INTERLEAVED // 2
    block = 2 if args.quick else 10
    if args.collectives_only:
        with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
            timing = collective_timing(timing_steps, block, Path(tmp), launch)
            rows = _print_timing(timing, timing_steps)
        if args.json:
            args.json.write_text(json.dumps({"machine": machine(), "collective_timing": rows}, indent=2))
        return 0
    walls = {name: Sample(f"{name} (process wall)", "s") for name in JOBS}
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        work = Path(tmp)
        contenders: dict[str, Callable[[], float]] = {
            name: (lambda name=name: _run(steps, name, work, walls[name], ranks, launch))
            for name in JOBS}
        samples = alternate(contenders, rounds, "s")
        blocks = interleaved(interleaved_steps, block, work)
        timing = collective_timing(timing_steps, block, work, launch)
        hooks = hook_cost(steps * 10, work)
    off = samples[OFF]
    paired = {name: Sample(f"{name} / tracking off, same round", "x",
                           [b / a for a, b in zip(off.values, samples[name].values, strict=True)])
              for name in (RELAY, AIM)}
    rate = {name: Sample(f"{name}: steps/s", "steps/s", [steps / t for t in samples[name].values]) for name in JOBS}
    rows = [off.row(), samples[RELAY].row(off), samples[AIM].row(off),
            rate[OFF].row(), rate[RELAY].row(rate[OFF]), rate[AIM].row(rate[OFF]),
            walls[OFF].row(), walls[RELAY].row(walls[OFF]), walls[AIM].row(walls[OFF])]
    print(table(rows, f"Training overhead: demo fine-tune on {ranks} CPU rank(s), {steps} steps, --logging_steps 1, "
                      "train_runtime"))
    block_rows = [blocks[OFF].row(), *(blocks[mode].row(blocks[OFF]) for mode in (RELAY, AIM, OFF_AGAIN))]
    print("\n" + table(block_rows, f"Interleaved: one job, {interleaved_steps} steps, tracking off / relay / Aim "
                                    "in turn every few steps, wall time per step cycle"))
    timing_rows = _print_timing(timing, timing_steps)
    step_time = blocks[OFF].median
    for name in (RELAY, AIM):
        print(f"whole jobs, {name} / off: median of same-round ratios {paired[name].median:.3f}, "
              f"range {paired[name].spread[0]:.3f}..{paired[name].spread[1]:.3f}")
    print(f"callback hooks per logged step: median {hooks.median * 1e6:.1f} us, max {hooks.spread[1] * 1e6:.1f} us "
          f"= {hooks.median / step_time * 100:.3f}% of the demo's median step ({step_time * 1e3:.1f} ms)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "steps": steps, "ranks": ranks,
                                         "interleaved_steps": interleaved_steps, "timing_steps": timing_steps,
                                         "rows": rows,
                                         "paired": {name: sample.row() for name, sample in paired.items()},
                                         "hooks": hooks.row(), "interleaved": block_rows,
                                         "collective_timing": timing_rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
