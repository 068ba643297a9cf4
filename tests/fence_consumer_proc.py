"""A consuming relay (``relay consume``) that kills or stops itself at one step of a commit when its
control file says so: the fence test's faults (tests/test_fleet_fence.py), at points a signal sent
from outside could not hit on purpose. The relay is the real one; only the moment is chosen.

    python tests/fence_consumer_proc.py CONTROL_FILE [relay consume options]

CONTROL_FILE, written by the test, holds {"step": STEP, "signal": "KILL" or "STOP"}. The next commit
of any partition that reaches STEP removes the file, says which partition in CONTROL_FILE.hit, and
sends the process the signal. The steps, in
a commit's order (relay/fleet/holder.py):

    fence   the batch taken, before it is appended to the central journal (the fence)
    write   appended, before the view's write
    flush   written, before the view's flush
    settle  flushed, before the view's position moves
    ack     settled, before the acknowledgements
    acked   after the acknowledgements
"""
from __future__ import annotations

import functools
import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the sink is tests.fence_sink:LedgerSink

from relay.cli.main import main
from relay.fleet.central import CentralJournal
from relay.fleet.holder import Holder
from relay.fleet.partition import Partition
from relay.journal.journal import Journal

CONTROL = Path(sys.argv.pop(1))
stage: dict[int, str] = {}  # partition -> the last step its commit passed


_taking = threading.Lock()  # partitions commit on executor threads: one of them takes the fault


def fault(step: str, k: int) -> None:
    """Send this process the signal the control file names, if it names ``step``: once, however many
    partitions reach it at the same moment. (Two threads that both read the file before either removed
    it both signalled: the second SIGSTOP came after the test's SIGCONT, and nothing woke the relay.)"""
    with _taking:
        try:
            wanted = json.loads(CONTROL.read_text())
        except (FileNotFoundError, ValueError):
            return
        if wanted.get("step") != step:
            return
        CONTROL.unlink()
        Path(f"{CONTROL}.hit").write_text(json.dumps({"step": step, "partition": k}))
    os.kill(os.getpid(), getattr(signal, f"SIG{wanted['signal']}"))


def before(step: str, after: str | None, number: callable, due: str | None):
    """Wrap a method: ``fault(step)`` before it when the partition's commit is at ``due``, then the
    partition's stage becomes ``after``."""
    def wrap(method):
        @functools.wraps(method)
        def sync(self, *args, **kwargs):
            k = number(self, *args)
            if k is not None and stage.get(k) == due:
                fault(step, k)
                stage[k] = after
            return method(self, *args, **kwargs)
        return sync
    return wrap


async def append(self, k, body, expected, _append=CentralJournal.append):
    fault("fence", k)
    position = await _append(self, k, body, expected)
    stage[k] = "appended"
    return position


async def ack(self, msgs, _ack=Holder.ack):
    if stage.get(self.k) == "settled":
        fault("ack", self.k)
        await _ack(self, msgs)
        stage.pop(self.k, None)
        fault("acked", self.k)
    else:
        await _ack(self, msgs)


def journal_partition(journal: Journal, *_: object) -> int | None:
    name = journal.path.name
    return int(name[1:]) if name[:1] == "p" and name[1:].isdigit() else None


CentralJournal.append = append
Holder.ack = ack
Partition.write = before("write", "written", lambda part, *_: part.number, "appended")(Partition.write)
Journal.flush = before("flush", "flushed", journal_partition, "written")(Journal.flush)
Partition.settle = before("settle", "settled", lambda part, *_: part.number, "flushed")(Partition.settle)

if __name__ == "__main__":
    main(prog_name="relay")
