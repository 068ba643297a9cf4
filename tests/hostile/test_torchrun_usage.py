"""A bad flag under torchrun: one ERROR line for the whole job (rank 0's), not one per rank, and
torchrun's failure summary names rank 0 alone, with that line as its cause."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from conftest import free_port
from trainer.sft import PEER_ERROR_WAIT
from trainer_fixtures import error_lines, run_trainer, torchrun

pytestmark = pytest.mark.slow  # real torchrun jobs

MESSAGE = "unrecognized arguments: --bogus_flag x"


@pytest.mark.parametrize("flags, message, status", [
    (["--bogus_flag", "x"], MESSAGE, 2),
    (["--relay_start_timeout", "0.001"], "embedded relay not ready after 0.001s (log: {out}/relay.log)", 1),
], ids=["bad-flag", "relay-cannot-start"])
def test_error_under_torchrun_is_reported_once(tmp_path: Path, flags: list[str], message: str, status: int) -> None:
    out = tmp_path / "out"
    message = message.format(out=out)
    done = run_trainer(torchrun(free_port()) + ["--demo", *flags, "--output_dir", str(out)])
    output = done.stdout + done.stderr
    errors = error_lines(output)
    assert len(errors) == 1 and errors[0].endswith(f"ERROR trainer: {message}"), output[-3000:]
    # torchrun exits 1 whenever a worker fails, whatever its status (it raises ChildFailedError):
    # the worker's status is in its summary, with rank 0 alone and the line above as the cause.
    assert done.returncode == 1, output[-3000:]
    summary = output[output.index("Root Cause (first observed failure):"):]
    assert "rank      : 0 (local_rank: 0)" in summary and f"exitcode  : {status} " in summary, output[-3000:]
    assert f"traceback : {message}" in summary
    assert "Failures:\n  <NO_OTHER_FAILURES>" in output, f"rank 1 is listed as a failure of its own:\n{output[-4000:]}"
    assert output.count(message) == 2  # the ERROR line, and torchrun's summary
    assert "Loading weights" not in output


def test_usage_error_of_another_rank_alone_is_still_reported(tmp_path: Path) -> None:
    """Rank 1 hits an error and nobody stops it (rank 0 did not hit it): after PEER_ERROR_WAIT it
    reports the error itself, naming its rank. (A bad value, as it stops the parse before the
    training arguments are built, which would look for rank 0.)"""
    started = time.monotonic()
    done = run_trainer([sys.executable, "-m", "trainer", "--demo", "--num_train_epochs", "many", "--output_dir",
                        str(tmp_path / "out")], RANK="1", WORLD_SIZE="2")
    assert time.monotonic() - started >= PEER_ERROR_WAIT, "it gave rank 0 time to report first"
    assert done.returncode == 2, done.stderr[-3000:]
    errors = error_lines(done.stderr)
    message = "rank 1: argument --num_train_epochs/--num-train-epochs: invalid float value: 'many'"
    assert len(errors) == 1 and errors[0].endswith(f"ERROR trainer: {message}"), done.stderr[-3000:]


def test_a_bad_flag_stops_the_parse_before_torch_distributed_starts(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun, making the training arguments (SFTConfig) starts the process group (gloo). A bad
    flag found after that stopped rank 0 while rank 1 could still be in gloo's connection set-up, which
    then failed too: a second failure in torchrun's summary (once, in a loaded run). Found before it,
    neither rank has a process group to leave."""
    import torch.distributed

    from trainer.args import parse_args
    from trainer.errors import UsageError

    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                        "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    try:
        with pytest.raises(UsageError, match="unrecognized arguments: --bogus_flag x"):
            parse_args(["--output_dir", str(tmp_path), "--bogus_flag", "x"])
        assert not torch.distributed.is_initialized()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


#: A rank as torchrun stops it while it still imports or reads its flags: the SIGTERM lands once the
#: handler is in place (trainer/__main__.py installs it before the imports) and before the bad flag is found.
STOPPED_EARLY = ("import os, signal, sys\nfrom trainer.stopping import STOP\nSTOP.install()\n"
                 "os.kill(os.getpid(), signal.SIGTERM)\nfrom trainer.__main__ import main\nsys.exit(main(sys.argv[1:]))")


def test_a_rank_stopped_while_it_reads_a_bad_flag_exits_0_without_a_word(tmp_path: Path) -> None:
    """Rank 0 stopped at the bad flag and torchrun stopped rank 1, a second behind (a loaded run): rank
    1 reaches the same flag, sees it was stopped, and exits 0 in silence, so torchrun's summary names
    rank 0 alone. Before, the SIGTERM raised while rank 1 read its flags: exit 143, a failure of its own."""
    done = run_trainer([sys.executable, "-c", STOPPED_EARLY, "--demo", "--bogus_flag", "x", "--output_dir",
                        str(tmp_path / "out")], RANK="1", WORLD_SIZE="2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert error_lines(done.stderr) == [], done.stderr[-3000:]
    assert not (tmp_path / "out").exists()
