"""The compatibility virtualenv: fms-hf-tuning 3.2.2 with its own pins (transformers 4.55, trl 0.19,
peft 0.19), the CPU torch of .venv, and this checkout installed beside them with the ``[hf]`` extra
only. ``make test`` builds it (``make fms-venv``, cached like .venv); the tests that run in it find it
here. A missing one fails the test that needs it with the command that builds it: a green run without
the compatibility tier would say nothing about the stacks our users run."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import once_per_run

ROOT = Path(__file__).resolve().parent.parent
#: Where the compatibility venv is: METRICS_RELAY_FMS_VENV, else .venv-fms in the checkout.
FMS_VENV = Path(os.environ.get("METRICS_RELAY_FMS_VENV") or ROOT / ".venv-fms")


def fms_python() -> str:
    """The compatibility venv's interpreter; the test fails, naming ``make fms-venv``, without it."""
    python = FMS_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no compatibility venv at {FMS_VENV}: run `make fms-venv` (make test builds it)")
    return str(python)


def fms_env(**extra: str) -> dict[str, str]:
    """The environment for a process of the compatibility venv: this checkout first on the path
    (whatever the venv's own editable install points at), offline, one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # an inner pytest is its own
    env.pop("PYTHONPATH", None)
    env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", **extra)
    return env


def run_fms(args: list[str], timeout: float = 600, **extra: str) -> subprocess.CompletedProcess[str]:
    """``args`` under the compatibility venv's python, from the checkout's root."""
    return subprocess.run([fms_python(), *args], cwd=ROOT, env=fms_env(**extra), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def fms_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model built by the compatibility venv's transformers 4.55 (a tokenizer transformers 5
    saved does not load there), once per test run."""
    with once_per_run(tmp_path_factory, "fms-demo-model") as folder:
        if not (folder / "demo-complete.json").exists():
            done = run_fms(["-c", f"from trainer.demo import build_demo; build_demo({str(folder)!r})"])
            assert done.returncode == 0, done.stderr[-3000:]
        return folder
