"""Which Aim run of a repository holds which relay run, for the Aim sink (sinks/aim.py): found by the
relay's run id stored in each Aim run, read once per relay lifetime; and the indexing of a closed
run, so Aim's own readers see it at once."""
from __future__ import annotations

import logging
from typing import Any, Counter

log = logging.getLogger(__name__)

#: Run params holding the relay's identity of the run (queryable in Aim: ``run.relay.run_id``).
PARAMS_KEY = "relay"


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
