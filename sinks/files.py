"""Small files the relay and its sinks keep (state, snapshots, exports) replaced whole: a reader, or
a process that dies mid-write, sees the old document or the new one, never part of one. Here, in
sinks/, because the relay imports sinks and never the reverse."""
from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``.

    The temporary file is hidden (no reader listing the folder takes it for a document) and named
    for this process (two relays may overlap on one state file). It is created with the umask's
    modes, so the relay's 0600 default and ``--world-readable`` (relay/daemon/bounds.py) hold.
    On OSError the temporary file is removed and the error raised: each caller decides whether a
    lost write is fatal, counted or only logged."""
    path = Path(path)  # a standard one: ClearML hands out its own pathlib2 paths
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
