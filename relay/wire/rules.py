"""Checks derived from one table of rules: what a valid value of each kind is (``Rule``), and for an
event model (each field's kind, sinks/events.py) every check the wire makes (``Rules``): the
event check of the hot path, the compact batch's column check and its row check, and the message
that names what is wrong. Each is generated from the same rules, so they cannot disagree and a new
field is a line in the model, not four edits here. relay/wire/schema.py holds the table itself.

The event and row checks are compiled once (as namedtuple builds its class) into one boolean
expression over locals with the limits inlined as constants: the hot path pays for no loop over
the table, only a failing event pays for the loop that finds what is wrong (``explain``).
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

_NONE = type(None)
#: The error a check raises, ``error(reason, detail)``: relay/wire/schema.py's FrameError.
Error = type[ValueError]


class Rule(NamedTuple):
    """What a valid value of one kind is. A value is checked in this order: its exact type (a bool
    is not an int), ``low``, ``high``, ``max_len``, ``among``, ``accept``, then ``deep``; the first
    test it fails names the reason (``under`` and ``over`` for the bounds, when they differ)."""

    types: tuple[type, ...]
    what: str  #: the message's words: "<field> must be <what>"
    low: float | None = None  #: numbers: the least valid value (NaN is never valid)
    high: float | None = None  #: numbers: the greatest
    max_len: int | None = None  #: strings: the most characters
    among: frozenset[str] | None = None  #: the only valid values
    accept: Callable[[Any], bool] | None = None  #: one more test of a value of the right type (memoized)
    deep: Callable[[Any], None] | None = None  #: checks inside a valid value; raises the error itself
    column: Callable[[list[Any]], bool] | None = None  #: ``deep`` over a column; False: look row by row
    reason: str = "bad_type"
    under: str | None = None  #: the reason below ``low`` (default ``reason``)
    over: str | None = None  #: the reason above ``high`` (default ``reason``)


class Field(NamedTuple):
    name: str
    rule: Rule
    nullable: bool


def fields_of(model: Mapping[str, str], kinds: Mapping[str, Rule]) -> list[Field]:
    """The model's ``{field: kind}`` (``"count"``, or ``"count | None"`` where nil is valid too) with
    each kind's rule; ImportError names a kind the table does not have."""
    fields = []
    for name, spec in model.items():
        kind, _, none = spec.partition(" | ")
        if kind not in kinds or none not in ("", "None"):
            raise ImportError(f"the event field {name!r} has kind {spec!r}: relay/wire/schema.py's KINDS has "
                              f"{sorted(kinds)} (add ' | None' where nil is valid); give the field one of "
                              "those or add its kind there")
        fields.append(Field(name, kinds[kind], bool(none)))
    return fields


def remembering(accept: Callable[[Any], bool]) -> tuple[set[Any], Callable[[Any], bool]]:
    """``accept`` remembering (up to 4096) the values it passed, so a run id's pattern is matched
    once per run, not once per event."""
    seen: set[Any] = set()

    def memo(value: Any) -> bool:
        if not accept(value):
            return False
        if len(seen) >= 4096:
            seen.clear()
        seen.add(value)
        return True

    return seen, memo


class _Compiler:
    """Writes the source of the generated checks; names the objects it refers to."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {}
        self.deep: list[str] = []

    def name(self, obj: Any) -> str:
        key = f"_k{len(self.namespace)}"
        self.namespace[key] = obj
        return key

    def constant(self, value: float | int) -> str:
        return repr(value) if math.isfinite(value) else self.name(value)

    def test(self, field: Field, var: str) -> str:
        """One field's rule as a boolean expression over ``var`` (deep checks are queued, not tested)."""
        rule = field.rule
        if len(rule.types) == 1:
            parts = [f"type({var}) is {self.name(rule.types[0])}"]
        else:
            parts = [f"type({var}) in {self.name(frozenset(rule.types))}"]
        if rule.low is not None and rule.low == rule.high:
            parts.append(f"{var} == {self.constant(rule.low)}")
        elif rule.low is not None and rule.high is not None:
            parts.append(f"{self.constant(rule.low)} <= {var} <= {self.constant(rule.high)}")
        elif rule.low is not None:
            parts.append(f"{var} >= {self.constant(rule.low)}")
        elif rule.high is not None:
            parts.append(f"{var} <= {self.constant(rule.high)}")
        if rule.max_len is not None:
            parts.append(f"len({var}) <= {rule.max_len}")
        if rule.among is not None:
            parts.append(f"{var} in {self.name(rule.among)}")
        if rule.accept is not None:
            seen, memo = remembering(rule.accept)
            parts.append(f"({var} in {self.name(seen)} or {self.name(memo)}({var}))")
        if rule.deep is not None:
            self.deep.append(f"{self.name(rule.deep)}({var})" if not field.nullable else
                             f"{var} is None or {self.name(rule.deep)}({var})")
        test = " and ".join(parts)
        return f"({var} is None or ({test}))" if field.nullable else f"({test})"

    def function(self, source: str, name: str) -> Callable[..., Any]:
        exec(source, self.namespace)  # noqa: S102 -- our own source, built from the rule table
        return self.namespace[name]


def why(field: Field, value: Any, error: Error) -> Exception | None:
    """What is wrong with ``value`` as ``field`` (an ``error(reason, detail)``), or None: the rules
    in their order, slowly."""
    if value is None and field.nullable:
        return None
    rule = field.rule
    said = f"{field.name} must be {rule.what}{' or nil' if field.nullable else ''}, got {_show(value)}"
    if type(value) not in rule.types:
        return error(rule.reason, said)
    if rule.low is not None and not rule.low <= value:
        return error(rule.under or rule.reason, said)
    if rule.high is not None and not value <= rule.high:
        return error(rule.over or rule.reason, said)
    if ((rule.max_len is not None and len(value) > rule.max_len) or (rule.among is not None and value not in rule.among)
            or (rule.accept is not None and not rule.accept(value))):
        return error(rule.reason, said)
    if rule.deep is not None:
        try:
            rule.deep(value)
        except error as exc:
            return exc
    return None


def _show(value: Any) -> str:
    """A value for a message, bounded: a hostile frame's megabyte string is not repeated in a log."""
    if type(value) is str:
        return repr(value[:64]) + ("..." if len(value) > 64 else "")
    if type(value) not in (int, float, bool, _NONE):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 64 else f"{text[:64]}..."


def _column_test(field: Field, error: Error) -> Callable[[tuple[Any, ...]], bool]:
    """One field's rule over a compact batch's column (a tuple of values), each test one pass in C."""
    rule, nullable = field.rule, field.nullable
    types = frozenset(rule.types) | ({_NONE} if nullable else set())
    # nil values are left out before the value tests; filter(None) does it in C, and may as well
    # leave out 0 and "" too where the rule takes those (else a comprehension keeps them).
    shallow = Field(field.name, rule._replace(deep=None), False)
    falsy_ok = all(why(shallow, kind(), error) is None for kind in rule.types)
    ints = set(rule.types) <= {int}
    low = -math.inf if rule.low is None else rule.low
    high = math.inf if rule.high is None else rule.high
    memo = remembering(rule.accept)[1] if rule.accept is not None else None

    def test(column: Any) -> bool:
        if not types.issuperset(map(type, column)):
            return False
        values = column if not nullable else list(filter(None, column)) if falsy_ok else [
            value for value in column if value is not None]
        if not values:
            return True
        if rule.low is not None or rule.high is not None:
            if not low <= min(values) <= max(values) <= high:
                return False
            if not ints and not all(map(math.isfinite, values)):  # (min and max can step over a NaN)
                return False
        if rule.max_len is not None and max(map(len, values)) > rule.max_len:
            return False
        if rule.among is not None and not rule.among.issuperset(values):
            return False
        if memo is not None and not all(map(memo, set(values))):
            return False
        return rule.column is None or rule.column(values)

    return test


class Rules:
    """Every check of one event model, derived from its fields' rules: ``validate_event`` (one
    event), ``columns`` (a compact batch's rows, column by column: the fast path), ``row_checks``
    (row by row: finds what is wrong) and ``explain`` (the message)."""

    def __init__(self, envelope: Mapping[str, str], row: Mapping[str, str], kinds: Mapping[str, Rule],
                 error: Error) -> None:
        self.error = error
        self.envelope = tuple(envelope)
        self.row = tuple(row)
        self.fields = tuple(envelope) + tuple(row)
        self.field_set = frozenset(self.fields)
        self._all = fields_of({**envelope, **row}, kinds)
        self._columns = [_column_test(field, error) for field in self._all[len(self.envelope):]]
        self.get_envelope = operator.itemgetter(*self.envelope)
        self.events_of_rows = self._rows_to_events()
        self.validate_event = self._event_check()
        self._row_ok = self._row_check()

    def _rows_to_events(self) -> Callable[..., list[dict[str, Any]]]:
        """``(rows, *envelope) -> events``: each a dict of the fields in order, one dict display per row
        (a dict of a zip per row costs twice as much)."""
        envelope = [f"e{i}" for i in range(len(self.envelope))]
        row = [f"r{i}" for i in range(len(self.row))]
        pairs = zip(self.fields, envelope + row, strict=True)
        items = ", ".join(f"{name!r}: {var}" for name, var in pairs)
        return eval(f"lambda rows, {', '.join(envelope)}: [{{{items}}} for {', '.join(row)} in rows]", {})

    def _event_check(self) -> Callable[[Any], None]:
        compiler = _Compiler()
        names = [f"f{i}" for i in range(len(self._all))]
        pairs = zip(self._all, names, strict=True)
        test = "\n            and ".join(compiler.test(field, var) for field, var in pairs)
        deep = "".join(f"\n            {call}" for call in compiler.deep)
        compiler.namespace.update(get=operator.itemgetter(*self.fields), explain=self.explain)
        source = (f"def validate_event(ev):\n"
                  f"    if type(ev) is dict and ev.keys() == {compiler.name(self.field_set)}:\n"
                  f"        {', '.join(names)}, = get(ev)\n"
                  f"        if ({test}):{deep}\n"
                  f"            return\n"
                  f"    explain(ev)\n")
        check = compiler.function(source, "validate_event")
        check.__doc__ = ("Check one decoded event against the schema; raise the schema's error naming what is "
                         "wrong. Generated from the rule table (relay/wire/rules.py).")
        return check

    def _row_check(self) -> Callable[..., bool]:
        """``(*row) -> bool``: a compact batch's row (its envelope checked already) passes the rules."""
        compiler = _Compiler()
        names = [f"r{i}" for i in range(len(self.row))]
        pairs = zip(self._all[len(self.envelope):], names, strict=True)
        test = " and ".join(compiler.test(field, var) for field, var in pairs)
        deep = "".join(f"\n        {call}" for call in compiler.deep)
        source = (f"def row_ok({', '.join(names)}):\n"
                  f"    if {test}:{deep}\n"
                  f"        return True\n"
                  f"    return False\n")
        return compiler.function(source, "row_ok")

    def explain(self, ev: Any) -> None:
        """The slow path of validate_event: find what is wrong and say it."""
        if type(ev) is not dict:
            raise self.error("not_event", f"batch element is {type(ev).__name__}, not a map")
        if ev.keys() != self.field_set:
            missing = self.field_set.difference(ev)
            if missing:
                raise self.error("missing_field", f"missing {sorted(missing)}")
            raise self.error("unknown_field", f"unknown {sorted(map(str, set(ev) - self.field_set))}")
        for field in self._all:
            wrong = why(field, ev[field.name], self.error)
            if wrong is not None:
                raise wrong
        raise self.error("invalid", "event fails validation")  # unreachable unless the checks disagree

    def columns(self, rows: list[Any]) -> tuple[tuple[Any, ...], ...] | None:
        """A compact batch's rows as columns if every rule passes on every row, checked a column at
        a time, each test one pass in C; None if one fails or a rule's ``column`` test leaves it to
        the rows (nested data), so the caller then finds out which, row by row."""
        if set(map(type, rows)) != {list} or set(map(len, rows)) != {len(self.row)}:
            return None
        columns = tuple(zip(*rows, strict=True))
        for test, column in zip(self._columns, columns, strict=True):
            if not test(column):
                return None
        return columns

    def row_checks(self, rows: list[Any], envelope: tuple[Any, ...]) -> list[dict[str, Any]]:
        """A compact batch as events, each row checked: the path for batches whose columns did not
        pass as a whole. The first event is checked whole, the envelope with it."""
        events: list[dict[str, Any]] = []
        width, row_ok = len(self.row), self._row_ok
        for row in rows:
            if type(row) is not list or len(row) != width:
                raise self.error("bad_type", f"compact event must be [{', '.join(self.row)}]")
            event = self.events_of_rows((row,), *envelope)[0]
            if not events:
                self.validate_event(event)
            elif not row_ok(*row):
                self.explain(event)
            events.append(event)
        return events
