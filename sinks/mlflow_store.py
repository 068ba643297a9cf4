"""An MLflow SQLite database set up so that a kill cannot break it (sinks/store_setup.py says why).

MLflow sets a database up in place whenever it lacks some of MLflow's tables (a new file, or one an
older MLflow made): ``ready_sqlite`` runs that same set-up first, with MLflow's own code, under the
store's set-up lock, in a temporary file (a copy, for a database that holds runs) renamed into
place once complete; MLflow's client then finds every table there and sets nothing up itself.

A database that an interrupted set-up left half made (by an older relay, or any MLflow process
killed at the wrong moment) and that holds nothing yet (no run, no experiment but Default) is
moved aside (``NAME.half-made-TIME``, named in the log) and made afresh. One that holds runs and
has all its tables at an older schema is MLflow's to refuse, as it always was: it asks for
``mlflow db upgrade``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sinks.store_setup import build_into_place, setup_lock

log = logging.getLogger(__name__)

PREFIX = "sqlite:///"


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` tracking URI (None for another URI or an in-memory one)."""
    if not uri.startswith(PREFIX):
        return None
    path = uri[len(PREFIX):].split("?", 1)[0]
    return Path(path).expanduser() if path and path != ":memory:" else None


def ready_sqlite(db: Path) -> None:
    """Leave ``db`` with every MLflow table at MLflow's current schema, or as it was (see above)."""
    from mlflow.store.db.utils import (
        _all_tables_exist,
        _get_latest_schema_revision,
        _get_schema_version,
    )
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    with setup_lock(db, "MLflow database"):
        if db.exists() and db.stat().st_size:
            # no connection kept: the file may be replaced
            engine = create_engine(f"{PREFIX}{db}", poolclass=NullPool)
            try:
                complete = _all_tables_exist(engine)
                if complete and _get_schema_version(engine) == _get_latest_schema_revision():
                    return
                held = _holds_anything(engine)
            finally:
                engine.dispose()
            if held and complete:  # an older schema: MLflow's own error says what to do
                return
            if held:
                build_into_place(db, lambda tmp: _set_up(tmp, copy_of=db))
                return
            aside = db.with_name(f"{db.name}.half-made-{int(time.time())}")
            log.warning("MLflow database %s was left half made by an interrupted set-up and holds "
                        "no run: moved aside to %s, and made afresh", db, aside)
            os.replace(db, aside)
        build_into_place(db, _set_up)


def _holds_anything(engine: Any) -> bool:
    """Whether the database holds a run, or an experiment other than Default (what a user would
    lose)."""
    from sqlalchemy import inspect, text

    tables = set(inspect(engine).get_table_names())
    with engine.connect() as connection:
        runs = ("runs" in tables
                and connection.execute(text("SELECT 1 FROM runs LIMIT 1")).first() is not None)
        return runs or ("experiments" in tables and connection.execute(
            text("SELECT 1 FROM experiments WHERE experiment_id != 0 LIMIT 1")).first() is not None)


def _set_up(tmp: Path, copy_of: Path | None = None) -> Path:
    """MLflow's own set-up (tables, migrations, the Default experiment) of ``tmp``: a copy of
    ``copy_of`` when given (SQLite's backup: a consistent copy, even of a file in use), else new."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    if copy_of is not None:
        with (contextlib.closing(sqlite3.connect(copy_of)) as source,
              contextlib.closing(sqlite3.connect(tmp)) as copy):
            source.backup(copy)
    uri = f"{PREFIX}{tmp}"
    # as MlflowClient builds its store: the same artifact root
    store = _get_sqlalchemy_store(uri, None)
    store.engine.dispose()
    SqlAlchemyStore._engine_map.pop(uri, None)
    return tmp
