"""What a rank sees of its launcher, for tests/test_warm_ranks.py: run the same under real torchrun
and warm (tests/warm_ranks.py), ``launch_probe_job.py FOLDER MODE``. Each rank writes what a rank
sees as it starts (torchrun's environment, its signal handlers, the signal it gets when its parent
dies, its argv) and the sum of a real gloo all_reduce to ``FOLDER/rank{RANK}.json``, then notes a
SIGTERM in ``FOLDER/rank{RANK}.sigterm`` and exits 143 on it. MODE ``die``: rank 1 SIGKILLs itself and rank 0 waits for the agent to stop it;
``hold``: both ranks wait for the test to stop the job."""
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
       "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


def pdeathsig() -> int:
    """The signal this process gets when its parent dies (prctl PR_GET_PDEATHSIG), 0 for none."""
    found = ctypes.c_int()
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(found), 0, 0, 0)
    return found.value


def stopped(signum: int, frame: object) -> None:
    (folder / f"rank{rank}.sigterm").touch()
    os._exit(143)


folder, mode = Path(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
seen = {"env": sorted(k for k in os.environ if k in ENV or k.startswith("TORCHELASTIC_")),
        "world": [os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")],
        "handlers": [signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGHUP)],
        "sigint": signal.getsignal(signal.SIGINT) == signal.default_int_handler,
        "argv": sys.argv[1:], "main": __name__, "pdeathsig": pdeathsig()}
signal.signal(signal.SIGTERM, stopped)
dist.init_process_group("gloo")
total = torch.tensor([rank + 1])
dist.all_reduce(total)
(folder / f"rank{rank}.json").write_text(json.dumps({**seen, "sum": int(total)}))
if mode == "die" and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    time.sleep(0.1)
