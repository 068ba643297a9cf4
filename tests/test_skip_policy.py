"""tests/skip_policy.py in a real pytest run of a small suite: a test module that importorskips a
tracker whose extra is missing is counted and named; in CI (or with --strict-skips) it fails the run,
with and without pytest-xdist; a skip on the allow-list never does."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

TESTS = Path(__file__).resolve().parent


def small_suite(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A checkout-like folder: tests/ with a module needing Aim (hidden from this environment), an
    allowed skip and a passing test, the policy registered as tests/conftest.py registers it."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport skip_policy\n"
        "def pytest_addoption(parser):\n    skip_policy.add_options(parser)\n"
        "def pytest_configure(config):\n    config.pluginmanager.register(skip_policy.SkipPolicy(config))\n")
    (tests / "test_tracker.py").write_text('import pytest\npytest.importorskip("aim")\n\ndef test_x():\n    pass\n')
    (tests / "test_tail.py").write_text('import pytest\n\ndef test_jq():\n    pytest.skip("jq is not installed")\n')
    (tests / "test_plain.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    hide = tmp_path / "no-aim"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['aim'] = None\n")
    # not the outer run's CI (each test sets its own) nor its PYTEST_ADDOPTS (options of the outer suite's
    # plugins, e.g. --budget-json, which this small suite does not load)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(hide), str(ROOT)])
    return tmp_path, env


def run(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on ``folder`` with no plugin but pytest-xdist (hypothesis's alone costs a CPU-second)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "xdist.plugin", "tests",
                           *args], cwd=folder, env={**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                          capture_output=True, text=True, timeout=120)


def test_a_missing_extra_is_named_and_passes_outside_ci(tmp_path: Path) -> None:
    folder, env = small_suite(tmp_path)
    done = run(folder, env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "ran 2 (2 passed, 0 failed), 0 errors, skipped 2 (1 not allowed), xfailed 0" in done.stdout, done.stdout
    assert "skip not on the allow-list: tests/test_tracker.py: could not import 'aim'" in done.stdout
    assert "an extra is missing: make setup, or pip install -e '.[aim]'" in done.stdout
    assert "allowed skip: tests/test_tail.py::test_jq: jq is not installed" in done.stdout


def test_in_ci_a_missing_extra_fails_the_run_across_workers(tmp_path: Path) -> None:
    folder, env = small_suite(tmp_path)
    done = run(folder, {**env, "CI": "true"}, "-n", "2")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "SKIP NOT ALLOWED: tests/test_tracker.py: could not import 'aim'" in done.stdout, done.stdout
    assert "the run fails: a skip not on tests/skip_policy.py ALLOWED" in done.stdout
    assert "2 passed, 2 skipped" in done.stdout


def test_allowed_skips_alone_pass_strict(tmp_path: Path) -> None:
    folder, env = small_suite(tmp_path)
    (folder / "tests" / "test_tracker.py").unlink()
    done = run(folder, env, "--strict-skips")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "skipped 1 (0 not allowed)" in done.stdout
