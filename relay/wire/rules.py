"""The one validation engine of the wire, built from one table of rules. A ``Rule`` says what a
valid value of one kind is; the event model (sinks/events.py) gives each field its kind; the table
itself is relay/wire/schema.py's ``KINDS``. From those two come:

- the msgspec types that decide (``typed``): a frame or a journal line is valid exactly when msgspec
  reads it into them, in C, as it decodes it;
- ``explain``, plain Python over the decoded object, which says what is wrong with one the types
  refused: the reason label counters show and the detail logs and dead letters keep.

Both read the same fields of each rule, in the same order; tests/test_schema_rules.py and the fuzzer
(tests/fuzz/targets.py) hold them to the same verdict on every input. No code is generated.
"""
from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, NamedTuple, Union

from msgspec import Meta

_NONE = type(None)
_SCALARS = frozenset({int, float, str, bool, _NONE})
_FLOAT_MAX = sys.float_info.max


#: A refusal's (reason, detail): relay/wire/schema.py raises it as its FrameError.
Refusal = tuple[str, str]


class Rule(NamedTuple):
    """What a valid value of one kind is. A value is checked in this order: its exact type (a bool
    is not an int), ``low``, ``high``, ``max_len``, ``among``, ``pattern``, then inside a map; the
    first test it fails names the reason (``under`` and ``over`` for the bounds, where they
    differ)."""

    types: tuple[type, ...]
    what: str  #: the message's words: "<field> must be <what>"
    low: float | None = None  #: numbers: the least valid value (NaN is never valid)
    high: float | None = None  #: numbers: the greatest
    max_len: int | None = None  #: strings: the most characters; maps: the most characters of a key
    among: frozenset[str] | None = None  #: the only valid values
    pattern: str | None = None  #: strings: a regular expression the value matches (``re.search``)
    depth: int | None = None  #: maps: how deep maps and lists nest in it, itself counted
    reason: str = "bad_type"
    under: str | None = None  #: the reason below ``low`` (default ``reason``)
    over: str | None = None  #: the reason above ``high`` (default ``reason``)


class Field(NamedTuple):
    name: str
    rule: Rule
    nullable: bool


def fields_of(model: Mapping[str, str], kinds: Mapping[str, Rule]) -> list[Field]:
    """The model's ``{field: kind}`` (``"count"``, or ``"count | None"`` where nil is valid too)
    with each kind's rule; ImportError names a kind the table does not have."""
    fields = []
    for name, spec in model.items():
        kind, _, none = spec.partition(" | ")
        if kind not in kinds or none not in ("", "None"):
            raise ImportError(f"the event field {name!r} has kind {spec!r}: relay/wire/schema.py's "
                              f"KINDS has {sorted(kinds)} (add ' | None' where nil is valid); give "
                              "the field one of those or add its kind there")
        fields.append(Field(name, kinds[kind], bool(none)))
    return fields


def typed(field: Field, finite: bool = False, patterns: bool = True) -> Any:
    """``field``'s rule as a msgspec type (nil too, if the field is nullable). ``finite``: a map's
    floats must be finite too, which no rule asks (a NaN metric is valid) but tells the caller that
    what the type took needs no look for one. ``patterns=False``: a string's pattern left out, for a
    caller that tests it itself, once per value rather than once per decoding (``matching``)."""
    kind = _typed(field.name, field.rule if patterns else field.rule._replace(pattern=None), finite)
    return kind | None if field.nullable else kind


def matching(pattern: str) -> Callable[[set[Any]], set[Any]]:
    """``values -> those that do not match pattern``, remembering (up to 4096) the values that did:
    a run id's pattern is tested once per run, not once per journal line."""
    search, seen = re.compile(pattern).search, set[Any]()

    def unmatched(values: set[Any]) -> set[Any]:
        new = values - seen
        if not new:
            return new
        wrong = {value for value in new if type(value) is not str or search(value) is None}
        if len(seen) > 4096:
            seen.clear()
        seen.update(new - wrong)
        return wrong

    return unmatched


def _typed(name: str, rule: Rule, finite: bool) -> Any:
    if rule.depth is not None and rule.max_len is not None:
        return _map_type(rule.max_len, rule.depth, finite)
    if rule.among is not None:
        return Literal[tuple(sorted(rule.among))]
    parts: list[Any] = []
    for kind in rule.types:
        if kind is int:
            low = None if rule.low is None else math.ceil(rule.low)
            high = None if rule.high is None else math.floor(rule.high)
            parts.append(Annotated[int, Meta(ge=low, le=high)])
        elif kind is float:
            parts.append(Annotated[float, Meta(ge=rule.low, le=rule.high)])
        elif kind is str:
            parts.append(Annotated[str, Meta(max_length=rule.max_len, pattern=rule.pattern)])
        else:
            raise ImportError(f"relay/wire/rules.py cannot type the field {name!r}: a "
                              f"{kind.__name__} (teach _typed() the kind, and explain() if it "
                              "checks anything new)")
    return Union[tuple(parts)]  # noqa: UP007 (a union of a runtime tuple, which | cannot spell)


def _map_type(max_key: int, depth: int, finite: bool) -> Any:
    """A map of string keys of at most ``max_key`` characters whose values are scalars, or maps and
    lists of them, nested ``depth`` deep at most (the map itself is the first level)."""
    key = Annotated[str, Meta(max_length=max_key)]
    number = Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)] if finite else float
    scalar = int | number | str | bool | None
    value: Any = scalar
    for _ in range(depth - 1):
        value = scalar | list[value] | dict[key, value]
    return dict[key, value]


class Repeated(dict[Any, Any]):
    """A decoded map that named a key more than once: the last value counts, as in a dict, but
    msgspec checks every value as it reads it, so ``explain`` looks at each (``pairs``)."""

    pairs: list[tuple[Any, Any]]


def pairs_hook(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A decoder's ``object_pairs_hook`` that keeps what ``explain`` needs of a repeated key."""
    built = dict(pairs)
    if len(built) == len(pairs):
        return built
    repeated = Repeated(built)
    repeated.pairs = pairs
    return repeated


def explain(fields: Sequence[Field], event: Any) -> Refusal | None:
    """What is wrong with one decoded event (a map with ``fields``), or None if nothing is: the
    first rule it breaks, in the order of the fields and of each rule's tests."""
    if not isinstance(event, dict):
        return ("not_event", f"batch element is {type(event).__name__}, not a map")
    names = {field.name for field in fields}
    if event.keys() != names:
        missing = names.difference(event)
        if missing:
            return ("missing_field", f"missing {sorted(missing)}")
        return ("unknown_field", f"unknown {sorted(map(str, set(event) - names))}")
    for field in fields:
        for value in _values(event, field.name):
            wrong = _why(field, value)
            if wrong is not None:
                return wrong
    return None


def _values(obj: dict[Any, Any], key: Any) -> list[Any]:
    """Every value ``obj`` gave ``key``, in order (more than one where the map repeated it)."""
    if type(obj) is Repeated:
        return [value for name, value in obj.pairs if name == key]
    return [obj[key]]


def _why(field: Field, value: Any) -> Refusal | None:
    if value is None and field.nullable:
        return None
    rule = field.rule
    nil = " or nil" if field.nullable else ""
    said = f"{field.name} must be {rule.what}{nil}, got {_show(value)}"
    if _kind(value) not in rule.types:
        return (rule.reason, said)
    if rule.low is not None and not rule.low <= value:
        return (rule.under or rule.reason, said)
    if rule.high is not None and not value <= rule.high:
        return (rule.over or rule.reason, said)
    if rule.depth is not None and rule.max_len is not None:
        return _map_error(value, rule.max_len, rule.depth, 1)
    if ((rule.max_len is not None and len(value) > rule.max_len)
            or (rule.among is not None and value not in rule.among)
            or (rule.pattern is not None and re.search(rule.pattern, value) is None)):
        return (rule.reason, said)
    return None


def _kind(value: Any) -> type:
    return dict if type(value) is Repeated else type(value)


def _map_error(obj: dict[Any, Any], max_key: int, depth: int, level: int) -> Refusal | None:
    """What is wrong inside a map at nesting ``level``, or None: its keys, then its values."""
    if level > depth:
        return ("too_deep", f"data nested deeper than {depth} levels")
    for key, value in obj.pairs if type(obj) is Repeated else obj.items():
        if type(key) is not str:
            return ("bad_type", f"data key {key!r} is not a string")
        if len(key) > max_key:
            return ("name_too_long", f"data key of {len(key)} chars exceeds {max_key}")
        wrong = _value_error(value, max_key, depth, level)
        if wrong is not None:
            return wrong
    return None


def _value_error(value: Any, max_key: int, depth: int, level: int) -> Refusal | None:
    kind = _kind(value)
    if kind in _SCALARS:
        return None
    if kind is dict:
        return _map_error(value, max_key, depth, level + 1)
    if kind is not list:
        return ("bad_type", f"data value of type {kind.__name__} is not allowed")
    if level + 1 > depth:
        return ("too_deep", f"data nested deeper than {depth} levels")
    for item in value:
        wrong = _value_error(item, max_key, depth, level + 1)
        if wrong is not None:
            return wrong
    return None


def _show(value: Any) -> str:
    """A value for a message, bounded: a hostile frame's megabyte string is not repeated in logs."""
    if type(value) is str:
        return repr(value[:64]) + ("..." if len(value) > 64 else "")
    if type(value) not in (int, float, bool, _NONE):
        return f"a {_kind(value).__name__}"
    text = repr(value)
    return text if len(text) <= 64 else f"{text[:64]}..."
