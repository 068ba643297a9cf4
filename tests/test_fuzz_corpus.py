"""The fuzzer (tests/fuzz, ``make fuzz``) in the normal suite: every input that ever broke a target
is kept in tests/fuzz/corpus/<target>/ and must pass its property now, and a short fresh search
per target keeps the strategies and properties themselves exercised."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz.runner import corpus_files
from fuzz.targets import TARGETS

#: Examples of the short search, per target: a few seconds each (ingest runs two relays per example).
EXAMPLES = {"decode": 300, "ingest": 40, "journal": 80}


@pytest.mark.parametrize("name, path", [pytest.param(name, path, id=f"{name}/{path.stem[:12]}")
                                        for name in sorted(TARGETS) for path in corpus_files(name)])
def test_corpus_input_passes(name: str, path: Path) -> None:
    TARGETS[name].check(path.read_bytes())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_short_fuzz_run(name: str) -> None:
    target = TARGETS[name]
    search = settings(max_examples=EXAMPLES[name], deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))(given(target.strategy)(target.check))
    search()
