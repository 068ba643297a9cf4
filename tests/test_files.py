"""sinks/files.py: the one atomic writer of the relay's and the sinks' small files."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sinks.files import write_atomic


def test_a_document_is_replaced_whole_with_the_umasks_mode(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    old = os.umask(0o077)
    try:
        write_atomic(path, "first")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        os.umask(0o022)
        write_atomic(path, b"second")
        assert path.read_text() == "second"
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # the new file's mode: the umask of now
    finally:
        os.umask(old)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_failed_replace_keeps_the_old_document_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, "kept")
    target = tmp_path / "folder"
    (target / "inside").mkdir(parents=True)  # a non-empty folder cannot be replaced by a file
    with pytest.raises(OSError):
        write_atomic(target, "lost")
    assert path.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "state.json"]
