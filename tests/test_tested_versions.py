"""A sink that reaches into its tool's private API names the releases it was tested with, and its
check() says in one line when another is installed (sinks/preflight.py, as Lightning's
RequirementCache states an integration's requirement)."""
from __future__ import annotations

import ast
import importlib.metadata
import logging
import re

import pytest
from packaging.requirements import Requirement

from conftest import ROOT, parse_python
from sinks.base import SinkError
from sinks.preflight import need_package, untested

TRACKER_SINKS = ("aim", "clearml", "mlflow", "tensorboard", "wandb")


def _tested(sink: str) -> tuple[str, str]:
    """The ``tested=`` range the sink's check() passes to need_package."""
    tree = parse_python((ROOT / "sinks" / f"{sink}.py").read_text())
    found = [ast.literal_eval(keyword.value) for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "need_package"
             for keyword in node.keywords if keyword.arg == "tested"]
    assert len(found) == 1, f"sinks/{sink}.py: check() names no tested range"
    return found[0]


def _pins(constraints: str) -> dict[str, str]:
    """A constraints file's ``name==version`` lines, by name."""
    return dict(line.split("==", 1) for line in (ROOT / constraints).read_text().splitlines()
                if line and not line.startswith("#"))


@pytest.mark.parametrize("sink", TRACKER_SINKS)
def test_each_tracker_sink_was_tested_with_the_release_installed(sink: str) -> None:
    """The venv the suite runs in is inside each sink's range: a tool upgraded here fails this until
    the sink is run against it and its range moved."""
    requirement, uses = _tested(sink)
    assert untested(requirement, uses) is None, untested(requirement, uses)


def test_make_setup_installs_each_tracker_within_the_range_its_sink_was_tested_with() -> None:
    """constraints.txt (``make setup`` installs with it) pins every package of a venv the suite passed
    in, each tracker within its sink's tested range, so a tool's new release on the index changes
    nothing the suite or CI runs until both are moved."""
    pins = _pins("constraints.txt")
    for sink in TRACKER_SINKS:
        requirement = Requirement(_tested(sink)[0])
        assert requirement.specifier.contains(pins[requirement.name]), (sink, pins[requirement.name])
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def test_make_fms_venv_installs_within_fms_hf_tuning_s_own_pins() -> None:
    """constraints-fms.txt does for .venv-fms what constraints.txt does for .venv; renewed from the
    wrong venv (transformers 5, say) it would move the compatibility tier off fms's pins, which this
    catches before a two-minute venv build does."""
    makefile = (ROOT / "Makefile").read_text()
    pins = _pins("constraints-fms.txt")
    fms_pins = re.search(r"^FMS_PINS := (.*?[^\\])$", makefile, re.MULTILINE | re.DOTALL)
    assert fms_pins is not None, "FMS_PINS not found in the Makefile"
    requirements = [Requirement(pin) for pin in re.findall(r'"([^"]+)"', fms_pins.group(1))]
    assert {r.name for r in requirements} >= {"transformers", "trl", "peft"}, requirements
    for requirement in requirements:
        assert requirement.specifier.contains(pins[requirement.name]), (requirement, pins[requirement.name])
    assert "torch" not in pins and "fms-hf-tuning" not in pins, "the Makefile pins both"
    assert makefile.count("-c constraints-fms.txt") == 2


def test_another_release_is_said_in_one_line_with_what_to_do(caplog: pytest.LogCaptureFixture) -> None:
    installed = importlib.metadata.version("msgpack")
    with caplog.at_level(logging.WARNING, logger="sinks.preflight"):
        need_package("msgpack", "demo", "demo", tested=("msgpack<1", "Unpacker._buffer"))
        need_package("msgpack", "demo", "demo", tested=(f"msgpack=={installed}", "Unpacker._buffer"))
        need_package("msgpack", "demo", "demo")
    assert [record.getMessage() for record in caplog.records] == [
        f"demo sink: msgpack {installed} is installed, but this sink was tested with msgpack<1 and uses its private "
        "API (Unpacker._buffer), which may have changed: if the sink fails or writes wrong, pip install 'msgpack<1'"]
    assert untested("no-such-distribution>=1", "x") is None  # not installed: need_package's error says so
    with pytest.raises(SinkError, match="needs no_such_module, which is not installed"):
        need_package("no_such_module", "demo", "demo", tested=("no-such-module>=1", "x"))
