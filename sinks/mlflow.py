"""The MLflow sink: one MLflow run per training run, whatever the number of ranks
(docs/sinks/mlflow.md).

A batch's points, params and tags go out with ``log_batch`` when the base class saves the applied
spans, which go last, as run tags: a retried batch rewrites identical points, which SQL stores
drop; a directory store appends, so its spans are in a file (sinks/mlflow_applied.py). MLflow is
imported only when the sink opens; its rules for names, keys and batch sizes are in
sinks/mlflow_rules.py.
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import click

from sinks.base import CLOSE_TIMEOUT, FLUSH_TIMEOUT, PermanentError, SinkContext, SinkError
from sinks.events import Event, json_safe
from sinks.mlflow_applied import applied_tags, read_applied, resume, run_dir, save_state
from sinks.mlflow_rules import (
    LABEL_MAPS,
    MAX_PARAM,
    MAX_TAG,
    PLAIN_GROUPS,
    batches,
    metric_name,
    mlflow_key,
    point,
)
from sinks.mlflow_run import MlRun
from sinks.mlflow_tracking import (
    experiment_id,
    is_directory,
    reach,
    set_defaults,
    store_folder,
    tracker_record,
)
from sinks.naming import SYSTEM, system_key
from sinks.preflight import need_package, need_writable_dir, tool_import
from sinks.tracker_base import Spans, TrackerSink
from sinks.tracker_export import export_dir, tracker_file, write_tracker_file

log = logging.getLogger(__name__)

EXPORT_NAME = "mlflow_tracker.json"  # what fms-hf-tuning writes into the job's output directory
RUN_TAG = "relay.run_id"  # how a restarted relay (or a replay) finds its MLflow run again
CHANGED_PREFIX = "relay.changed."
FULL_VALUES = "relay_params"  # artifact folder: the whole of what was cut to MLflow's limits
STATUS = {"completed": "FINISHED", "finished": "FINISHED", "success": "FINISHED",
          "killed": "KILLED", "interrupted": "KILLED",
          "cancelled": "KILLED"}  # anything else: FAILED


class MlflowSink(TrackerSink):
    """Write relay events into MLflow: a SQL database, a directory, or an ``mlflow server``."""

    name = "mlflow"

    @classmethod
    def options(cls) -> list[click.Option]:
        """fms-hf-tuning's names for the two settings, defaulting to MLflow's own variables."""
        return [
            click.Option(["--mlflow-tracking-uri"], metavar="URI", envvar="MLFLOW_TRACKING_URI",
                         default=None,
                         help="sqlite:///PATH.db, a directory, or http://HOST:PORT of an `mlflow "
                              "server` (default: $MLFLOW_TRACKING_URI)."),
            click.Option(["--mlflow-experiment"], metavar="NAME", envvar="MLFLOW_EXPERIMENT_NAME",
                         default=None,
                         help="MLflow experiment of the runs, created if missing "
                              "(default: $MLFLOW_EXPERIMENT_NAME, else Default)."),
        ]

    def __init__(self, mlflow_tracking_uri: str | None = None,
                 mlflow_experiment: str | None = None) -> None:
        super().__init__()
        if not mlflow_tracking_uri:
            raise SinkError("--sink mlflow needs --mlflow-tracking-uri URI (sqlite:///PATH.db, a "
                            "directory, or http://HOST:PORT of an `mlflow server`), or "
                            "$MLFLOW_TRACKING_URI")
        self.uri = mlflow_tracking_uri
        self.experiment = mlflow_experiment or "Default"
        self.remote = self.uri.startswith(("http://", "https://"))
        self.directory = is_directory(self.uri)
        self._client: Any = None
        self._experiment_id: str | None = None
        self._ml: dict[str, MlRun] = {}
        # (rank, subset, sub_dataset, system, name) -> MLflow metric key
        self._keys: dict[tuple, str] = {}
        self._exports: set[str] = set()

    def check(self, context: SinkContext) -> None:
        """MLflow installed, and a local store's folder writable (a server is not asked: it may come
        up later)."""
        need_package("mlflow", self.name, "mlflow",
                     tested=("mlflow>=3.17,<3.19", "mlflow.store.db.utils internals"))
        folder = store_folder(self.uri)
        if folder is not None:
            need_writable_dir(folder, f"--mlflow-tracking-uri {self.uri}: folder",
                              "pass a writable sqlite:///PATH.db or directory, or a server's "
                              "http:// URL")

    def open(self, context: SinkContext) -> None:
        """Reach the store (not a server: it may come up later); SinkError if it cannot be used."""
        super().open(context)
        set_defaults(self.uri)
        with tool_import("mlflow", "MLflow"):
            from mlflow import MlflowClient, entities
        self._Metric, self._Param, self._RunTag = entities.Metric, entities.Param, entities.RunTag
        try:
            self._client = reach(self.uri, MlflowClient)
            if not self.remote:
                self._experiment()
        except SinkError:
            raise
        except Exception as exc:  # a bad URI or store fails in many ways: a config error here
            raise SinkError(f"--mlflow-tracking-uri {self.uri} cannot be used "
                            f"({type(exc).__name__}: {exc}): pass a writable sqlite:///PATH.db "
                            "or directory, or a server's http:// URL") from None
        log.info("mlflow sink writing to %s, experiment %r", self.uri, self.experiment)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Every batch went out with its save: nothing is pending."""
        log.info("mlflow sink closed: %s", dict(sorted(self.counters.items())))
        return True

    def _experiment(self) -> str:
        """The experiment's id, found (or created) once."""
        if self._experiment_id is None:
            self._experiment_id = experiment_id(self._client, self.experiment, self.uri)
        return self._experiment_id

    def write(self, events: Sequence[Event]) -> None:
        ml = self._ml
        for event in events:
            if event["run"] not in ml:
                ml[event["run"]] = MlRun(event["ts"])
        try:  # apply (sinks/tracker_base.py), then export
            super().write(events)
        except Exception:  # nothing stays pending: the relay retries the whole batch, and the base
            for r in self._ml.values():  # class applies what was not saved again
                r.discard()
            raise
        self._export_due()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        self._export_due()
        return True

    def _export_due(self) -> None:
        for run in list(self._exports):
            exported = self._ml.get(run)
            if exported is not None and exported.run_id is not None:
                self._exports.discard(run)
                self._export(run, exported)

    def start_run(self, run: str, params: dict[str, Any]) -> None:
        """Nothing yet: ``load_applied`` next finds the MLflow run (tagged with ``run``) or makes
        it."""

    def log_metrics(self, run: str, rank: int | None, step: int | None, epoch: float | None,
                    context: dict[str, Any], values: dict[str, float | int], ts: float) -> None:
        keys, metric = self._keys, self._Metric
        system = context.get(SYSTEM)
        where = (rank, context.get("subset"), context.get("sub_dataset"), system)
        # no step: 0, as fms-hf-tuning's track()
        ts_ms, step = int(ts * 1000), 0 if step is None else step
        out = self._ml[run].metrics
        for name, value in values.items():
            key = keys.get((*where, name))
            if key is None:
                full = system_key(context, name) if system else metric_name(*where[:3], name)
                key = keys[(*where, name)] = self._key(full)
            out.append(metric(key, value, ts_ms, step))

    def log_params(self, run: str, name: str, params: dict[str, Any]) -> None:
        r = self._ml[run]
        for key, value in params.items():
            if name == "model" and key in LABEL_MAPS and isinstance(value, dict):
                # as PretrainedConfig keeps it
                value = {int(k) if k.isdigit() else k: v for k, v in value.items()}
            full = key if name in PLAIN_GROUPS else f"{name}.{key}"
            mkey, whole = self._key(full), {"group": name, "key": key, "value": value}
            text = self._fit(r, mkey, str(json_safe(value)), MAX_PARAM, whole, renamed=mkey != full)
            have = r.params.get(mkey, r.new_params.get(mkey))
            if have is None:
                r.new_params[mkey] = text
            elif have != text:
                self._changed(r, mkey, text, whole)
        if name == "run":
            self._standard_tags(r, params)
        output_dir = export_dir(params)
        if name in ("run", "hparams") and output_dir is not None \
                and r.export_to(output_dir, from_run=name == "run"):
            self._exports.add(run)
        if name == "relay.lifecycle" and isinstance(params.get("train_end"), dict):
            r.ended_at(params["train_end"].get("ts"))

    def _standard_tags(self, r: MlRun, params: dict[str, Any]) -> None:
        """What MLflow's run page reads ("Created by", "Source", the run's name), as MLflow's own
        logging in the training process would set them: from the job's ``run`` params."""
        for tag, key in (("mlflow.runName", "run_name"), ("mlflow.user", "user"),
                         ("mlflow.source.name", "source")):
            value = params.get(key)
            if isinstance(value, str) and value:
                r.tags[tag] = value[:MAX_TAG]
        if isinstance(params.get("source"), str):
            r.tags["mlflow.source.type"] = "LOCAL"
        if isinstance(params.get("run_name"), str) and params["run_name"]:
            r.rename(params["run_name"])

    def finish_run(self, run: str, status: str) -> None:
        self._ml[run].ends(STATUS.get(status.lower(), "FAILED"))

    def load_applied(self, run: str) -> Spans:
        """Resume the MLflow run tagged with this run id, or create it; its spans from its tags."""
        r, client = self._ml[run], self._client
        found = client.search_runs([self._experiment()],
                                   filter_string=f"tags.`{RUN_TAG}` = '{run}'",
                                   max_results=1, order_by=["attributes.start_time ASC"])
        self._exports.add(run)
        if not found:
            made = client.create_run(self._experiment(), start_time=int(r.first_ts * 1000),
                                     tags={RUN_TAG: run}, run_name=run)
            r.attach(made.info.run_id, made.info.experiment_id, run, {}, made=True)
            self.counters["runs_created"] += 1
            log.info("mlflow run %s created for run %s", r.run_id, run)
            return {}
        info, tags = found[0].info, found[0].data.tags
        r.attach(info.run_id, info.experiment_id, info.run_name or run, dict(found[0].data.params))
        self.counters["runs_resumed"] += 1
        log.info("mlflow run %s resumed for run %s", r.run_id, run)
        try:
            if not self.directory:
                return read_applied(tags) or {}
            spans, cut = resume(run_dir(self.uri, r), tags)  # cut: a killed relay's unsaved points
            self.counters["uncommitted_bytes_cut"] += cut
            return spans
        except ValueError:  # torn by a full disk: all again, as after a failed save
            r.save_failed(partial=self.directory)
            return {}

    def save_applied(self, run: str, spans: Spans) -> None:
        """Send what the run's events made, then the spans that say they are in."""
        r = self._ml[run]
        try:
            self._send(r, spans)
        except Exception as exc:
            r.save_failed(partial=self.directory)
            from mlflow.exceptions import MlflowException

            # by someone, meanwhile: the retry makes a new run (and catches up)
            if self._deleted(r):
                self.forget_run(run)
                self.counters["runs_deleted"] += 1
                log.warning("mlflow run %s of run %s was deleted; a new one takes the run's events",
                            r.run_id, run)
            elif isinstance(exc, MlflowException) and exc.error_code == "INVALID_PARAMETER_VALUE":
                raise PermanentError(f"MLflow refused it: {exc.message}") from exc
            raise
        r.saved()

    def _deleted(self, r: MlRun) -> bool:
        """Whether the run's MLflow run was deleted (asked after a failed save only). A server's
        or a SQL store's failures, the network's included, come as MlflowException."""
        from mlflow.exceptions import MlflowException

        try:
            return self._client.get_run(r.run_id).info.lifecycle_stage != "active"
        except MlflowException as exc:
            return exc.error_code == "RESOURCE_DOES_NOT_EXIST"
        except OSError:  # a directory store cannot answer: no verdict (the save's error is raised)
            return False

    def _send(self, r: MlRun, spans: Spans) -> None:
        client, metrics = self._client, r.metrics
        for path, content in r.artifacts.items():
            client.log_text(r.run_id, content, path)
        if r.suspect:
            self._repair(r)
            metrics = []
        params = [self._Param(k, v) for k, v in r.new_params.items()]
        tags = [self._RunTag(k, v) for k, v in r.tags.items()]
        # train_end's status, and a directory store's points, before the spans that say they are in
        last = [] if r.end or self.directory else self._applied(spans)
        for m, p, t in batches(metrics, params, tags, last):
            client.log_batch(r.run_id, metrics=m, params=p, tags=t)
        if r.end:
            end_ms = int(r.end_ts * 1000) if isinstance(r.end_ts, (int, float)) else None
            client.set_terminated(r.run_id, r.end, end_time=end_ms)
        if self.directory:
            save_state(run_dir(self.uri, r), spans)
        elif not last:
            client.log_batch(r.run_id, tags=self._applied(spans))

    def _applied(self, spans: Spans) -> list[Any]:
        return [self._RunTag(key, value) for key, value in applied_tags(spans)]

    def _repair(self, r: MlRun) -> None:
        """After a failed save into a directory store, which appends points and which a full disk
        can leave with torn (empty) files: send only the points it lacks, first (that mends torn
        metric files, past which MLflow cannot read the run), then take its params as they are, a
        torn one (empty) removed and sent again, so the pending params that differ become
        ``relay.changed.*`` tags."""
        held: dict[str, Counter] = {}  # as many of a point as the store has (a step's epoch: twice)
        lacking = []
        for m in r.metrics:
            points = held.get(m.key)
            if points is None:
                history = self._client.get_metric_history(r.run_id, m.key)
                points = held[m.key] = Counter(point(x) for x in history)
            if points[point(m)] > 0:
                points[point(m)] -= 1
            else:
                lacking.append(m)
        for m, _, _ in batches(lacking, [], [], []):
            self._client.log_batch(r.run_id, metrics=m)
        r.holds(dict(self._client.get_run(r.run_id).data.params))
        for key, text in list(r.new_params.items()):
            if text and r.params.get(key) == "" and self._untorn(r, key):
                del r.params[key]  # sent again, whole, with the rest
            elif r.params.get(key, text) != text:
                del r.new_params[key]
                self._changed(r, key, text, {"key": key, "value": text})

    def _untorn(self, r: MlRun, key: str) -> bool:
        """Remove a param file a full disk left empty (MLflow created it, then had no room for
        its value): MLflow refuses to change a param, so only then can the value be logged."""
        path = run_dir(self.uri, r) / "params" / key
        if not self.directory or not path.is_file() or path.stat().st_size:
            return False
        path.unlink()
        self.counters["params_untorn"] += 1
        return True

    def _changed(self, r: MlRun, key: str, text: str, whole: dict[str, Any]) -> None:
        """MLflow refuses to change a param: the first value stays, the newest goes to a tag."""
        tag = self._key(CHANGED_PREFIX + key)
        r.tags[tag] = self._fit(r, tag, text, MAX_TAG, whole)
        self.counters["params_changed"] += 1
        log.warning("mlflow sink: param %r changed; MLflow keeps its first value, the newest is "
                    "in tag %r", key, tag)

    def _key(self, name: str) -> str:
        """A key MLflow takes (sinks/mlflow_rules.py); one renamed past HF's character rule is
        counted."""
        key, renamed = mlflow_key(name)
        if renamed:
            self.counters["renamed_keys"] += 1
            log.warning("mlflow sink: %r is %r in MLflow (too long, or a path that resolves "
                        "elsewhere)", name, key)
        return key

    def _fit(self, r: MlRun, key: str, text: str, limit: int, whole: dict[str, Any],
             renamed: bool = False) -> str:
        """``text`` within ``limit``; what is cut or renamed is counted and kept whole as an
        artifact."""
        if not renamed and len(text) <= limit:
            return text
        r.artifacts[f"{FULL_VALUES}/{key}.json"] = json.dumps(json_safe(whole), default=str)
        self.counters["params_cut"] += 1
        log.warning("mlflow sink: %r cut to MLflow's limits; whole in artifact %s/%s.json", key,
                    FULL_VALUES, key)
        return text[:limit]

    def _export(self, run: str, r: MlRun) -> None:
        """A failure is counted and logged, never worth retrying a batch for. Not under ``relay
        replay``: the job's file names its live run, which a rebuilt copy must not replace."""
        target = tracker_file(EXPORT_NAME, run, r.output_dir, self.context.journal)
        if self.context.replay or target is None:
            return
        record = tracker_record(self.uri, r.name or run, r.experiment_id, r.run_id)
        write_tracker_file(target, record, self.counters, self.name, run)
