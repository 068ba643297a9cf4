"""The Aim sink's repository (sinks/aim.py): its one-time set-up, safe against a kill; which Aim run
holds which relay run, found by the relay's run id stored in each Aim run, read once per relay
lifetime; and the indexing of a closed run, so Aim's own readers see it at once."""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from sinks.store_setup import build_into_place, setup_lock

log = logging.getLogger(__name__)

#: Run params holding the relay's identity of the run (queryable in Aim: ``run.relay.run_id``).
PARAMS_KEY = "relay"


def open_local(repo_cls: Any, root: Path) -> Any:
    """The local repository at ``root``, set up first if it is not (sinks/store_setup.py): a new one
    is made in a temporary folder and renamed into place once Aim has written its ``VERSION``, so a
    kill leaves no half-made repository; one that an older relay's interrupted set-up left without
    a whole ``VERSION`` (Aim writes it last) gets Aim's set-up again in place, which is safe to
    repeat. Aim's set-up is not run on a whole repository (it rewrites ``VERSION`` every time)."""
    from aim.sdk.configs import get_aim_repo_name

    aim_dir = root / get_aim_repo_name()
    if _versioned(aim_dir):
        return repo_cls.from_path(str(root))
    with setup_lock(aim_dir, "Aim repository"):
        if not aim_dir.exists():
            build_into_place(aim_dir, lambda tmp: _set_up(repo_cls, tmp) / get_aim_repo_name())
        elif not _versioned(aim_dir):
            log.warning("Aim repository %s was left half made by an interrupted set-up; setting "
                        "it up again", root)
            # a torn one fails Aim before its set-up starts
            (aim_dir / "VERSION").unlink(missing_ok=True)
            return repo_cls.from_path(str(root), init=True)
    return repo_cls.from_path(str(root))


def _versioned(aim_dir: Path) -> bool:
    """Whether Aim's set-up of the repository finished: its last step writes a whole ``VERSION``."""
    try:
        parts = (aim_dir / "VERSION").read_text().strip().split(".")
    except (FileNotFoundError, NotADirectoryError):
        return False
    return all(part.isdigit() for part in parts)


def _set_up(repo_cls: Any, root: Path) -> Path:
    """Aim's own set-up of a repository at ``root``, every file closed once it returns."""
    repo = repo_cls(str(root), init=True)
    repo.structured_db.engine.dispose()
    return root


class RunLookup:
    """Relay run id -> Aim run hash in one repository, from the runs read or made so far."""

    def __init__(self, counters: Counter[str]) -> None:
        self.counters = counters
        self._hash_of: dict[str, str] = {}  # run id -> Aim run hash, from runs we scanned or made
        self._scanned: set[str] = set()  # Aim run hashes whose run id we read

    def made(self, run_id: str, run_hash: str) -> None:
        """The sink created ``run_hash`` for ``run_id``."""
        self._hash_of[run_id] = run_hash
        self._scanned.add(run_hash)

    def find(self, repo: Any, run_id: str) -> str | None:
        """The Aim run already holding ``run_id``: each repo run is read once per relay lifetime.

        ``list_all_runs`` (unlike ``iter_runs``) also sees runs not indexed yet, such as ones a
        crashed relay left open.
        """
        found = self._hash_of.get(run_id)
        if found is not None:
            return found
        forget_listing(repo)
        for run_hash in sorted(set(repo.list_all_runs()) - self._scanned):
            self._scanned.add(run_hash)
            try:
                owner = run_id_of(repo, run_hash)
            except Exception as exc:  # a corrupt or half-deleted run is not ours to fix; counted
                self.counters["unreadable_runs"] += 1
                log.warning("aim run %s unreadable while looking for run %s: %s: %s",
                            run_hash, run_id, type(exc).__name__, exc)
                continue
            if isinstance(owner, str):
                self._hash_of.setdefault(owner, run_hash)
        return self._hash_of.get(run_id)


def forget_listing(repo: Any) -> None:
    """Aim caches a repo's run listing for 0.5 s, which hides a run made a moment ago (by this sink
    or another process); the listing is one directory read, so read it afresh."""
    type(repo)._all_run_hashes.cache_clear()


def run_id_of(repo: Any, run_hash: str) -> Any:
    """Read the run's own metadata, as Aim's indexer does: a read-only ``Run`` reads the repo
    index, which does not hold runs that were never closed or indexed."""
    tree = repo.request_tree("meta", run_hash, read_only=True, skip_read_optimization=True)
    return tree.subtree(("meta", "chunks", run_hash, "attrs", PARAMS_KEY)).get("run_id")


def index(repo: Any, run_hash: str, counters: Counter[str]) -> None:
    """Index a closed run as ``aim up`` would, so ``Repo.iter_runs`` and read-only ``Run`` objects
    see it at once; if the index is busy (``aim up`` indexing), it does it later (counted)."""
    from aim.sdk.index_manager import RepoIndexManager

    try:
        RepoIndexManager.get_index_manager(repo).index(run_hash)
    except Exception as exc:  # counted; aim up / aim server index the run themselves
        counters["index_errors"] += 1
        log.warning("aim run %s not indexed yet (%s: %s); `aim up` indexes it", run_hash,
                    type(exc).__name__, exc)
