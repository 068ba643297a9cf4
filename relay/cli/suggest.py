"""What a mistyped name was likely meant to be: "did you mean" for commands and metrics, with the
nearest names only, never a list of everything there is (a journal holds hundreds of metrics). A
name ``stage/key`` is as near as the nearer of itself and its ``key`` (``losss``:
``train/loss``)."""
from __future__ import annotations

import difflib
from collections.abc import Iterable

NEAREST = 10  # names a message offers at most
CLOSE = 0.6  # similarity (difflib's ratio) from which a name is taken to be the one meant


def nearest(word: str, names: Iterable[str], n: int = NEAREST) -> tuple[list[str], bool]:
    """Up to ``n`` of ``names`` nearest to ``word``, nearest first, and whether the first is close
    enough to be what was meant (else they are only the least far)."""
    matcher = difflib.SequenceMatcher(b=word)

    def distance(name: str) -> tuple[float, str]:
        best = 0.0
        for form in {name, name.rsplit("/", 1)[-1]}:
            matcher.set_seq1(form)
            best = max(best, matcher.ratio())
        return -best, name

    scored = sorted(map(distance, set(names)))[:n]
    close = [name for score, name in scored if -score >= CLOSE]
    return (close, True) if close else ([name for _, name in scored], False)


def did_you_mean(word: str, names: Iterable[str], what: str, n: int = NEAREST) -> str:
    """``did you mean 'train/loss', 'eval/loss'?`` or ``the 10 nearest of the 42 WHAT: ...``; "" for
    none."""
    pool = set(names)
    found, close = nearest(word, pool, n)
    quoted = ", ".join(repr(name) for name in found)
    if not found:
        return ""
    if close:
        return f"did you mean {quoted}?"
    return (f"{what}: {quoted}" if len(found) == len(pool)
            else f"the {len(found)} nearest of the {len(pool)} {what}: {quoted}")


def no_such_command(word: str, commands: list[str]) -> str:
    """``no such command 'lpot'; did you mean 'plot'?``, else every command (there are few)."""
    near, close = nearest(word, commands, n=1)
    if close:
        return f"no such command {word!r}; did you mean {near[0]!r}?"
    return f"no such command {word!r}; commands: {', '.join(commands)} (see 'relay --help')"
