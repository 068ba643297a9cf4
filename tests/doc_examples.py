"""The runnable examples of README.md and docs/: found by a marker, run as written, and the example
outputs regenerated from real runs (``python -m tests.doc_examples --write``).

A fenced block is an example when the line right before it is a marker::

    <!-- doc-test: python id=NAME setup=publish relay="--sink mlflow ..." slow -->

- ``python``: run as a script (``venv=fms``: by the compatibility venv's python, fms-hf-tuning 3.2.2
  at its pins: tests/compat_env.py); ``bash``: run with ``bash -e``. Each runs in a fresh folder (the
  sandbox) with this checkout on PYTHONPATH and the ``relay`` command on PATH, and must exit with
  ``exit`` (0). ``creates=A,B``: files it must leave. ``slow``: the slow test tier.
- ``setup=NAME`` fills the placeholders the block names (see SETUPS): the files it reads exist
  under the names the doc gives them, ``$MODEL`` is set, a relay is there when the doc has one.
- ``output=NAME``: the block is what the example ``id=NAME`` prints. ``--write`` replaces it with
  a real run's output; the test compares the two line by line with numbers, hex ids and times
  blanked (``normalize``), in any order, so a figure that moves passes and a key that is added,
  renamed or gone fails. ``varies=REGEX`` on the output block: lines that timing decides to print
  or not (a relay's log line that depends on when it was killed), left out of the comparison.

- ``skip="why"``: a block that cannot be run here (a relay that serves until stopped, a server, a
  cluster, a GPU, a terminal, real output of a training job), and why, in a few words.

Markers are HTML comments, invisible on GitHub, on the line right above the block's opening fence
(which starts its line). Every Python or shell block (``python``, ``bash``, ``sh``, ``shell``,
``console``, or an untagged block that starts with a ``$ `` prompt) has one: tests/test_docs.py fails
on one that has none (``test_every_python_and_shell_snippet_is_run_or_says_why_not``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!--\s*doc-test:(.*?)-->\s*$")
#: What the sandbox's path is shown as in a regenerated output.
SHOWN_SANDBOX = "/tmp/doc-example"
#: How long an example may run.
TIMEOUT_S = 600


@dataclass
class Block:
    """A marked fenced block: where it is, its language and text, and the marker's options."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    opts: dict[str, str] = field(default_factory=dict)
    start: int = 0  # line index of the first line inside the fence
    end: int = 0  # line index of the closing fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The marked fenced blocks of one markdown file, in order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        mark = MARKER.match(lines[i])
        if mark is None:
            i += 1
            continue
        fence = i + 1
        if fence >= len(lines) or not lines[fence].startswith("```"):
            raise ValueError(f"{path}:{i + 1}: a doc-test marker must be right above a fenced block")
        end = next((j for j in range(fence + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{path}:{fence + 1}: fenced block never closed")
        opts = {}
        for word in shlex.split(mark.group(1)):
            key, eq, value = word.partition("=")
            opts[key] = value if eq else ""
        found.append(Block(path, fence + 1, lines[fence][3:].strip(), "\n".join(lines[fence + 1:end]) + "\n",
                           opts, fence + 1, end))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path)]


# -- setups: the placeholders of an example, made real ---------------------------------------------

def _env(sandbox: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RELAY_ADDRESS", "MLFLOW_TRACKING_URI", "NO_COLOR")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    env["WANDB_SILENT"] = "true"
    env["XDG_CONFIG_HOME"] = str(sandbox / ".config")  # the user's relay secret, as one shown path
    env.update(extra)
    return env


class Relay:
    """``relay ARGS`` in the sandbox on a free port, until stop()."""

    def __init__(self, sandbox: Path, args: list[str]) -> None:
        ready = sandbox / ".relay-ready.json"
        with open(sandbox / ".relay.log", "ab") as log:  # the relay writes through its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relay", "--bind", "tcp://127.0.0.1:*", "--ready-file",
                 str(ready), "--live", "off", "--shutdown-timeout", "280", *args],
                cwd=sandbox, stdout=log, stderr=subprocess.STDOUT, env=_env(sandbox))
        deadline = time.monotonic() + 300  # a wait: a relay with tracker sinks on a loaded machine
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"relay {args} did not start: {(sandbox / '.relay.log').read_text()[-2000:]}")
            time.sleep(0.05)
        self.address = json.loads(ready.read_text())["address"]
        ready.unlink()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        # its sinks get up to --shutdown-timeout to finish (a set-up under load)
        code = self.proc.wait(300)
        if code != 0:
            raise RuntimeError(f"relay exited {code}")


def publish(sandbox: Path, opts: dict[str, str]) -> dict[str, str]:
    """``relay=ARGS`` serves while the two ranks of ``tests/sink_helpers.py`` publish a run
    (``run``, ``steps``, ``experiment``, ``output_dir``), then stops."""
    relay = Relay(sandbox, shlex.split(opts.get("relay", "")))
    try:
        ranks = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "sink_helpers.py"), relay.address,
                                   opts.get("run", "job-42"), str(rank), opts.get("steps", "6"),
                                   opts.get("experiment", "-"),
                                   str(sandbox / opts["output_dir"]) if "output_dir" in opts else "-", "0.02"],
                                  cwd=sandbox, env=_env(sandbox), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for rank in (0, 1)]
        for proc in ranks:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            if proc.returncode != 0 or json.loads(out.splitlines()[-1])["left"]:
                raise RuntimeError(f"a rank did not deliver its events: {err.decode()[-2000:]}")
    finally:
        relay.stop()
    _settled(sandbox)
    return {}


def _settled(sandbox: Path, timeout: float = 300) -> None:
    """Wait until no process started there is left: a tracker's own helper (wandb-core) may
    outlive the sink process that started it and still be writing what the example reads."""
    import psutil

    def left() -> list[psutil.Process]:
        procs = []
        for proc in psutil.process_iter():
            try:
                if Path(proc.cwd()).is_relative_to(sandbox):
                    procs.append(proc)
            except (psutil.Error, OSError):  # gone meanwhile, or not ours to look at
                continue
        return procs

    deadline = time.monotonic() + timeout
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)


#: Where setup=demo puts the demo model in the sandbox ($MODEL).
DEMO_MODEL = Path("path", "to", "model")


def demo(sandbox: Path, opts: dict[str, str]) -> dict[str, str]:
    """The demo model at ``path/to/model`` ($MODEL; built unless a complete one is there already)
    and the first ``records`` (24) records of the demo data at ``data.jsonl``."""
    from trainer.argv_rewrite import DEMO_DATA
    from trainer.demo import build_demo

    model = sandbox / DEMO_MODEL
    build_demo(str(model))
    records = Path(DEMO_DATA).read_text(encoding="utf-8").splitlines()[:int(opts.get("records", "24"))]
    (sandbox / "data.jsonl").write_text("\n".join(records) + "\n", encoding="utf-8")
    return {"MODEL": str(model)}


def checkout(sandbox: Path, opts: dict[str, str]) -> dict[str, str]:
    """The checkout's ``tests/`` (its stand-in ranks) at ``tests/``, as in the checkout."""
    (sandbox / "tests").symlink_to(ROOT / "tests")
    return {}


SETUPS: dict[str, Callable[[Path, dict[str, str]], dict[str, str]]] = {
    "publish": publish, "demo": demo, "checkout": checkout}


# -- running an example --------------------------------------------------------------------------------

@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    sandbox: Path


def run(block: Block, sandbox: Path) -> Result:
    """Set up the block's placeholders in ``sandbox`` and run it there as written."""
    extra: dict[str, str] = {}
    setup = block.opts.get("setup")
    if setup:
        extra = SETUPS[setup](sandbox, block.opts)
    if block.lang == "python":
        python = sys.executable
        if block.opts.get("venv") == "fms":
            from compat_env import fms_python  # tests/ is on the path: pytest's, or main()'s

            python = fms_python()
        cmd = [python, "-c", block.text]
    elif block.lang == "bash":
        cmd = ["bash", "-e", "-c", block.text]
    else:
        raise ValueError(f"{block.where}: cannot run a {block.lang!r} block")
    env = _env(sandbox, **extra)
    if block.opts.get("relay_env") is not None:  # a relay at $RELAY_ADDRESS while it runs
        relay = Relay(sandbox, shlex.split(block.opts["relay_env"]))
        env["RELAY_ADDRESS"] = relay.address
    else:
        relay = None
    try:
        done = subprocess.run(cmd, cwd=sandbox, env=env, capture_output=True, text=True,
                              timeout=float(block.opts.get("timeout", TIMEOUT_S)))
    finally:
        if relay is not None:
            relay.stop()
    return Result(done.returncode, done.stdout.replace(str(sandbox), SHOWN_SANDBOX), done.stderr, sandbox)


def problems(block: Block, result: Result) -> list[str]:
    """What the run shows wrong with the example (empty: it works as documented)."""
    found = []
    want = int(block.opts.get("exit", "0"))
    if result.code != want:
        found.append(f"{block.where}: exit {result.code}, documented {want}: {result.stderr[-3000:]}")
    for name in filter(None, block.opts.get("creates", "").split(",")):
        if not (result.sandbox / name).exists():
            found.append(f"{block.where}: did not write {name}")
    return found


_HEX = re.compile(r"\b(?=[0-9a-z]*\d)[0-9a-z]{8,}\b")  # run hashes, W&B/MLflow/ClearML ids
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_CURVE_KEY = re.compile(r"(?<![^\s'])[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}(?![^\s'])")  # Z85, random


def normalize(text: str, varies: str = "") -> list[str]:
    """An output's lines with what changes from run to run blanked (numbers, ids, times), sorted:
    publishers race, so rows may come in another order. Lines matching ``varies`` (the output
    block's option: a line that timing decides to print or not) are left out."""
    lines = [line for line in text.strip("\n").split("\n") if not (varies and re.search(varies, line))]
    return sorted(_NUMBER.sub("N", _HEX.sub("H", _CURVE_KEY.sub("KEY", line))).rstrip() for line in lines)


def outputs() -> dict[str, Block]:
    """``output=NAME`` blocks by NAME."""
    return {b.opts["output"]: b for b in all_blocks() if "output" in b.opts}


def rewrite(block: Block, text: str) -> None:
    """Replace the body of ``block`` in its file with ``text``."""
    lines = block.path.read_text(encoding="utf-8").split("\n")
    lines[block.start:block.end] = text.rstrip("\n").split("\n")
    block.path.write_text("\n".join(lines), encoding="utf-8")


def regenerate(names: list[str]) -> Iterator[str]:
    """Run the examples whose output is shown (all, or ``names``) and write their outputs."""
    shown = outputs()
    for block in all_blocks():
        name = block.opts.get("id")
        if name is None or name not in shown or (names and name not in names):
            continue
        with tempfile.TemporaryDirectory(prefix="doc-example-") as tmp:
            result = run(block, Path(tmp))
            wrong = problems(block, result)
            if wrong:
                raise RuntimeError("\n".join(wrong))
        rewrite(outputs()[name], result.stdout)  # found again: an earlier rewrite may have moved it
        yield f"{shown[name].where}: output of {block.where} written"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate the output=NAME blocks from real runs")
    parser.add_argument("names", nargs="*", help="only these examples (their id=NAME)")
    args = parser.parse_args()
    if not args.write:
        for block in all_blocks():
            print(block.where, block.lang, " ".join(f"{k}={v}" if v else k for k, v in block.opts.items()))
        return
    for line in regenerate(args.names):
        print(line)


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the checkout, and tests/ as pytest puts it
    main()
