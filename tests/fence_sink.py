"""A tracker for the fence test (tests/test_fleet_fence.py): the sink-author API over one SQLite
file that every consuming relay's sink processes share, as they would share an MLflow server. Like
MLflow's store it keeps a metric once however often the very same value is written at a step (a
batch applied again after a kill, before its spans were saved, rewrites itself), and its applied
spans beside the metrics; a step written with another value is a second row. Cheap to start,
unlike a real tracker's client, so one starts per partition per takeover without costing the suite
minutes."""
from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any

import click

from sinks.base import SinkContext
from sinks.tracker_base import Spans, TrackerSink

SCHEMA = ("CREATE TABLE IF NOT EXISTS metrics (run TEXT, rank INTEGER, step INTEGER, name TEXT, value REAL, "
          "PRIMARY KEY (run, rank, step, name, value))",
          "CREATE TABLE IF NOT EXISTS spans (run TEXT PRIMARY KEY, spans TEXT)")


class LedgerSink(TrackerSink):
    name = "ledger"

    @classmethod
    def options(cls) -> list[click.Option]:
        return [click.Option(["--ledger-db"], required=True, help="The SQLite file.")]

    def __init__(self, ledger_db: str) -> None:
        super().__init__()
        self.path = ledger_db

    def open(self, context: SinkContext) -> None:
        super().open(context)
        self._local = threading.local()  # a connection per thread: the driver's thread writes, close() is elsewhere
        for statement in SCHEMA:
            self.db.execute(statement)

    @property
    def db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")  # a test's tracker: no fsync per row
        return db

    def log_metrics(self, run: str, rank: int | None, step: int | None, epoch: float | None,
                    context: dict[str, Any], values: dict[str, float | int], ts: float) -> None:
        self.db.executemany("INSERT OR IGNORE INTO metrics VALUES (?, ?, ?, ?, ?)",
                            [(run, rank, step, name, value) for name, value in values.items()])

    def start_run(self, run: str, params: dict[str, Any]) -> None:
        """Nothing: the ledger keeps points only."""

    def log_params(self, run: str, name: str, params: dict[str, Any]) -> None:
        """Nothing: the ledger keeps points only."""

    def finish_run(self, run: str, status: str) -> None:
        """Nothing: the ledger keeps points only."""

    def load_applied(self, run: str) -> Spans:
        row = self.db.execute("SELECT spans FROM spans WHERE run = ?", (run,)).fetchone()
        return {int(rank): spans for rank, spans in json.loads(row[0]).items()} if row else {}

    def save_applied(self, run: str, spans: Spans) -> None:
        self.db.execute("INSERT OR REPLACE INTO spans VALUES (?, ?)", (run, json.dumps(spans)))

    def close(self, timeout: float = 30.0) -> bool:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
        return True


def rows(path: str) -> dict[tuple[str, int, int], int]:
    """(run, rank, step) -> how many values the ledger holds at it."""
    with sqlite3.connect(path, timeout=60) as db:
        return {(run, rank, step): n for run, rank, step, n in
                db.execute("SELECT run, rank, step, COUNT(*) FROM metrics GROUP BY run, rank, step")}
