"""The wire's rules (relay/wire/rules.py) as msgspec types, so a whole frame or journal line is decoded
and checked in one C call: what msgspec takes, the rule takes too, as the same values. A rule's
``accept`` test (the run id's pattern) is not in the type: the caller tests it after, once per value
(``remembering``). What msgspec refuses is not necessarily wrong (nested data, an integer past 64
bits): the caller hands it to the rules themselves, which judge it and name what is wrong.

relay/wire/schema.py types compact batches with it, relay/wire/typed_lines.py journal lines; neither
the types nor the tests that hold them to the rules need an edit for a new field or kind.
"""
from __future__ import annotations

import math
import sys
from typing import Annotated, Any, Literal, Union

from msgspec import Meta

from relay.wire.rules import Field, Rule

#: Integers msgspec reads as ints: past 64 bits a value is the rules' to judge (orjson reads it as a
#: float, and a frame cannot carry one).
INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX = sys.float_info.max


def flat_map(max_key: int) -> Any:
    """A map's type: string keys of at most ``max_key`` characters, flat values only, finite floats
    only (a nested map or list, a NaN or an infinity is the rules' to judge, as a relay's column
    check leaves nested data to its row checks; what the types take is then known to be finite)."""
    value = (Annotated[int, Meta(ge=INT64[0], le=INT64[1])]
             | Annotated[float, Meta(ge=-_MAX, le=_MAX)] | str | bool | None)
    return dict[Annotated[str, Meta(max_length=max_key)], value]


def typed(field: Field, max_key: int) -> Any:
    """``field``'s rule as a msgspec type (nil too, if the field is nullable); ImportError for a rule
    it cannot say (a check inside a value other than a map's)."""
    rule = field.rule
    kind = _typed(field.name, rule, max_key)
    return kind | None if field.nullable else kind


def _typed(name: str, rule: Rule, max_key: int) -> Any:
    if rule.types == (dict,):
        return flat_map(max_key)
    if rule.deep is not None or rule.column is not None:
        raise ImportError(f"relay/wire/typed_rules.py cannot type the field {name!r}: its rule checks inside a "
                          f"{'/'.join(t.__name__ for t in rule.types)}; teach _typed() that check, or leave such "
                          "values to the rules")
    if rule.among is not None:
        return Literal[tuple(sorted(rule.among))]
    parts: list[Any] = []
    for kind in rule.types:
        if kind is int:
            low = INT64[0] if rule.low is None else max(INT64[0], math.ceil(rule.low))
            high = INT64[1] if rule.high is None else min(INT64[1], math.floor(rule.high))
            parts.append(Annotated[int, Meta(ge=low, le=high)])
        elif kind is float:
            parts.append(Annotated[float, Meta(ge=rule.low, le=rule.high)])
        elif kind is str:
            parts.append(Annotated[str, Meta(max_length=rule.max_len)] if rule.max_len is not None else str)
        else:
            raise ImportError(f"relay/wire/typed_rules.py cannot type the field {name!r}: a {kind.__name__}")
    return Union[tuple(parts)]  # noqa: UP007 (a union of a runtime tuple, which | cannot spell)


def rows_of(fields: list[Field], max_key: int) -> Any:
    """A compact batch's rows: a list of tuples of ``fields``' types, each row exactly as long."""
    return list[tuple.__class_getitem__(tuple(typed(field, max_key) for field in fields))]  # type: ignore[misc]
