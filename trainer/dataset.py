"""Loading instruction data (JSON or JSONL) into the shape trl's SFTTrainer trains on.

With a response template each text is split at its first occurrence into ``prompt`` (up to and
including the template) and ``completion``; trl then puts the loss on the completion only, which
is what the seed's completion-only collator did. Every record is checked up front, so a data set
without the template fails before a model is loaded instead of silently training on nothing.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from trainer.errors import UsageError

if TYPE_CHECKING:
    import datasets


def _records(path: str, flag: str) -> Iterator[tuple[int, Any]]:
    """Yield (record number from 1, record) from a JSON array file or a JSON-lines file."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{flag} {path}: invalid JSON: {exc}") from None
        yield from enumerate(records, 1)
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{flag} {path}: line {lineno} is not valid JSON: {exc.msg}") from None


def load_sft_dataset(
    path: str, text_field: str, response_template: str | None, flag: str = "--data_path",
    formatter: Callable[[dict[str, Any]], str] | None = None,
) -> datasets.Dataset:
    """Read ``path`` into a data set of ``text_field`` (or ``prompt``/``completion``); UsageError on
    bad data. ``formatter`` makes each record's text (--data_formatter_template) instead of
    ``text_field``."""
    import datasets

    if not os.path.isfile(path):
        what = "is not a file" if os.path.exists(path) else "does not exist"
        raise UsageError(f"{flag}: {path} {what}")
    rows: list[dict[str, str]] = []
    missing_template: list[int] = []
    for number, record in _records(path, flag):
        where = f"{flag} {path}: record {number}"
        if not isinstance(record, dict):
            raise UsageError(f"{where} is a {type(record).__name__}, not a JSON object")
        try:
            text = record.get(text_field) if formatter is None else formatter(record)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
        if text is None:
            raise UsageError(f"{where} has no field {text_field!r} (set --dataset_text_field)")
        if not isinstance(text, str):
            raise UsageError(
                f"{where}: field {text_field!r} is a {type(text).__name__}, not a string")
        if response_template is None:
            rows.append({text_field: text})
            continue
        cut = text.find(response_template)
        if cut < 0:
            missing_template.append(number)
            continue
        cut += len(response_template)
        rows.append({"prompt": text[:cut], "completion": text[cut:]})
    if missing_template:
        raise UsageError(
            f"{flag} {path}: response template {response_template!r} not found in "
            f"{len(missing_template)} record(s), first in record {missing_template[0]}"
        )
    if not rows:
        raise UsageError(f"{flag} {path}: no records")
    return datasets.Dataset.from_list(rows)
