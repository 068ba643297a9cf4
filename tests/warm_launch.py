"""Warm ranks: torchrun's own elastic launcher, started from a process that imported torch,
transformers, trl and peft once (docs/development.md, "Warm ranks"; the pytest side is
tests/warm_ranks.py).

A torchrun launch of the trainer costs about 20 CPU-seconds, nearly all of it three fresh
interpreters importing torch (torchrun's agent) and torch, transformers, trl and peft (each rank).
This program imports them once and then serves jobs: for each request (a torchrun command line,
an environment, a working folder and the job's stdin, stdout and stderr, passed as descriptors on
a Unix socket) it forks a job process that runs what ``torchrun`` runs, ``parse_args``,
``config_from_args`` and ``elastic_launch`` from ``torch.distributed.run``, with one change: the
entrypoint is a function (``warm_rank``) and the start method ``fork``. So the agent is torch's
``LocalElasticAgent`` with its real rendezvous (the static TCP store on ``--master_port``), each
rank a real process it forks, given torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/PORT, TORCHELASTIC_*), watched, and stopped as torchrun stops a failed job's survivors
(SIGTERM, then SIGKILL after its grace); the rank meets its peers in a real gloo process group, and
the script or module runs in it as ``python -u`` runs it (``runpy``, ``sys.argv``, its exit status,
its exit handlers). Only the imports are shared: the serving process runs no torch op, starts no
thread, and forks a job only from its one thread.

Its replies on the socket, one JSON object a message: ``{"ready": cpu}`` once the imports are done,
``{"pid": pid}`` for each job started, ``{"exit": pid, "status": code, "cpu": seconds}`` when a job
ends (its exit code, or minus the signal that killed it, as ``subprocess`` says it; its CPU and that
of every process it reaped, its ranks included). Run as ``warm_launch.py FD``.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import resource
import runpy
import select
import signal
import socket
import sys
import traceback

HANDLED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torch's agent takes these (TORCHELASTIC_SIGNALS_TO_HANDLE)
PR_SET_PDEATHSIG = 1  # prctl(2)
PIDS_ENV = "WARM_RANK_PIDS"  # a folder where each rank writes rank{RANK}.pid (psutil cannot see a fork's environ)


def preload() -> None:
    """What a rank and torchrun's agent import before they do anything (``python -X importtime``)."""
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch.distributed.run  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401
    from transformers import Trainer, TrainerCallback  # noqa: F401
    from trl import SFTConfig, SFTTrainer  # noqa: F401

    import trainer.sft  # noqa: F401


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter makes of ``sys.exit(code)``: a message is printed and is status 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def warm_rank(module: bool, target: str, *argv: str) -> None:
    """One rank: ``python -u [-m] target argv`` in this forked process, to its exit status."""
    for name in HANDLED:  # a fresh interpreter's handlers, not the agent's (inherited by the fork)
        signum = getattr(signal, name)
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    # torch.multiprocessing asks for SIGINT when the agent dies; torchrun's ranks (subprocesses)
    # get nothing: a rank whose agent was SIGKILLed trains on until it is killed itself.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
    if os.environ.get(PIDS_ENV):
        with open(os.path.join(os.environ[PIDS_ENV], f"rank{os.environ['RANK']}.pid"), "w") as out:
            out.write(str(os.getpid()))
    sys.argv = [target, *argv]
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(target))
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 - as the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # a forked multiprocessing child ends in os._exit: the interpreter's exit runs these
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)  # the agent sees the exit status, as it sees a torchrun rank's


def launch(argv: list[str]) -> None:
    """``torchrun argv`` (torch.distributed.run's ``run``), each rank ``warm_rank`` forked by the agent."""
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args(argv)
    if args.master_port is None or args.no_python or args.run_path:
        sys.exit("warm_launch: give --master_port, and a script or -m module for python to run")
    config, _, _ = config_from_args(args)
    config.start_method = "fork"

    @record  # as torchrun's ``main`` is
    def run() -> None:
        elastic_launch(config=config, entrypoint=warm_rank)(args.module, args.training_script,
                                                            *args.training_script_args)
    run()


def job(argv: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> None:
    """The forked job process: torchrun's, with the request's stdio, environment and folder."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.setpgid(0, 0)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    code = 0
    try:
        launch(argv)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 - torchrun's ChildFailedError and the like, as the interpreter shows them
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def serve(sock: socket.socket) -> None:
    """Fork a job for each request; say when each ends. Ends when the other side closes."""
    def send(**message: object) -> None:
        sock.send(json.dumps(message).encode())

    running: set[int] = set()
    send(ready=cpu(resource.getrusage(resource.RUSAGE_SELF)))
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05 if running else None)
        if readable:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            if not message:
                break
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                sock.close()
                job(request["argv"], request["env"], request["cwd"], fds)
            with contextlib.suppress(ProcessLookupError):  # its group before its pid is said, as
                os.setpgid(pid, pid)  # bench/relay_forker.py does: a killpg then finds it
            for fd in fds:
                os.close(fd)
            running.add(pid)
            send(pid=pid)
        while running:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            send(exit=pid, status=-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status),
                 cpu=cpu(usage))
    for pid in running:  # the tests are gone: so are their jobs
        os.killpg(pid, signal.SIGKILL)
    os._exit(0)  # not the interpreter's exit, whose collections walk the whole heap (1-1.5 CPU-s)


if __name__ == "__main__":
    control = socket.socket(fileno=int(sys.argv[1]))
    preload()
    serve(control)
