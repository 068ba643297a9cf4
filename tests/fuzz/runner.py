"""Run the targets under hypothesis for a set time, keeping every new failure in the corpus.

Hypothesis reports each distinct failure of a run with its own minimal example (shrinking one
never slips into another, which would leave an unshrunk input in the database that the next run
replays without shrinking). To find more bugs in one session than one run shows, a failure
whose signature (exception type and where in relay/ or sinks/ it was raised, or the violated
invariant) is already known counts as a pass, so the search moves on to the next kind. Signatures
are known from the corpus (replayed at start) and from what this session found.
"""
from __future__ import annotations

import hashlib
import logging
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from relay.wire import schema

from .targets import Target, Violation

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
DATABASE = HERE / ".hypothesis"
CODE = tuple(str(Path(schema.__file__).resolve().parents[1] / d) for d in ("relay", "sinks"))
CHUNK_SECONDS = 30.0  # the longest one hypothesis run lasts before the next target's turn
FIRST_CHUNK = 20  # examples of a target's first run, which measures its rate


def signature(exc: BaseException) -> str:
    """What makes two failures the same bug: the violated invariant (and its cause), or the
    exception type and the innermost relay/ or sinks/ line it came through."""
    if isinstance(exc, Violation):
        cause = exc.__cause__
        return exc.label if cause is None else f"{exc.label} <- {signature(cause)}"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(CODE)] or frames[-1:]
    if not ours:
        return type(exc).__name__
    where = ours[-1]
    path = Path(where.filename)
    return f"{type(exc).__name__} at {path.parent.name}/{path.name}:{where.lineno} in {where.name}"


def _leaves(exc: BaseException) -> list[BaseException]:
    """The failures in what hypothesis raised: one exception, or a group of them (one per bug)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def corpus_files(name: str) -> list[Path]:
    """The kept failing inputs of target ``name``, in a stable order."""
    return sorted((CORPUS / name).glob("*.bin"))


def failure(target: Target, data: bytes) -> BaseException | None:
    """The exception ``data`` makes ``target`` raise, or None."""
    try:
        target.check(data)
    except Exception as exc:  # any exception is the finding
        return exc
    return None


@dataclass
class Tally:
    """One target's figures for the summary."""

    examples: int = 0
    seconds: float = 0.0
    asked: int = 0  # max_examples of the last run
    found: list[str] = field(default_factory=list)
    added: list[Path] = field(default_factory=list)


class Session:
    """One fuzzing session over some targets: which failures are known, and each target's figures."""

    def __init__(self, targets: list[Target], log: logging.Logger) -> None:
        self.targets = targets
        self.log = log
        self.known: dict[str, set[str]] = {t.name: set() for t in targets}
        self.tally: dict[str, Tally] = {t.name: Tally() for t in targets}

    def replay_corpus(self) -> None:
        """Signatures the corpus already shows are not news."""
        for target in self.targets:
            files = corpus_files(target.name)
            failing = Counter(signature(exc) for exc in (failure(target, p.read_bytes()) for p in files)
                              if exc is not None)
            self.known[target.name] |= set(failing)
            self.log.info("%s: corpus of %d files, %d distinct failures still open%s", target.name, len(files),
                          len(failing), "".join(f"\n    {n} x {sig}" for sig, n in sorted(failing.items())))

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline - 1:
            for i, target in enumerate(self.targets):
                left = deadline - time.monotonic()
                if left < 1:
                    break
                self.chunk(target, min(CHUNK_SECONDS, left / (len(self.targets) - i)))

    def chunk(self, target: Target, budget: float) -> None:
        """One hypothesis run of about ``budget`` seconds (sized by the rate seen so far)."""
        tally = self.tally[target.name]
        rate = tally.examples / tally.seconds if tally.seconds else 0.0
        # A target's first examples are its smallest, so the rate they show is grown into gradually.
        count = min(4 * tally.asked, max(FIRST_CHUNK, int(rate * budget))) if rate else FIRST_CHUNK
        tally.asked = count
        known = self.known[target.name]
        latest: dict[str, bytes] = {}
        stop_at = time.monotonic() + budget

        def body(data: bytes) -> None:
            if not latest and time.monotonic() > stop_at:
                return  # time is up and nothing to shrink: let hypothesis run out its count unchecked
            tally.examples += 1
            exc = failure(target, data)
            if exc is None:
                return
            sig = signature(exc)
            if sig in known:
                return
            latest[sig] = data
            raise exc

        test = settings(
            max_examples=count, deadline=None, database=DirectoryBasedExampleDatabase(DATABASE / target.name),
            suppress_health_check=list(HealthCheck), report_multiple_bugs=True, print_blob=False,
            verbosity=Verbosity.quiet,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        )(given(target.strategy)(body))
        start, before = time.monotonic(), tally.examples
        try:
            test()
        except Exception as exc:  # the minimal failing example of each new bug, replayed last
            for one in _leaves(exc):
                sig = signature(one)
                if sig in latest and sig not in known:
                    self.record(target, sig, latest[sig], one)
            if not any(signature(one) in latest for one in _leaves(exc)):
                self.log.error("%s: hypothesis failed without a failing input: %s", target.name,
                               "".join(traceback.format_exception(exc)))
                raise
        finally:
            elapsed = time.monotonic() - start
            tally.seconds += elapsed
            self.log.info("%s: %d examples asked, %d run in %.1f s", target.name, count, tally.examples - before,
                          elapsed)

    def record(self, target: Target, sig: str, data: bytes, exc: BaseException) -> None:
        self.known[target.name].add(sig)
        tally = self.tally[target.name]
        tally.found.append(sig)
        path = CORPUS / target.name / f"{hashlib.sha1(data).hexdigest()}.bin"
        again = failure(target, data)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_bytes(data)
            tally.added.append(path)
        self.log.warning("%s: NEW %s\n    %s: %.300s\n    input: %d bytes %r%s -> %s", target.name, sig,
                         type(exc).__name__, exc, len(data), data[:120], "..." if len(data) > 120 else "",
                         path.relative_to(HERE.parent.parent))
        if again is None or signature(again) != sig:
            self.log.warning("    (replaying it gave %s: flaky)", "a pass" if again is None else signature(again))

    def summary(self) -> str:
        lines = [f"{'target':<8} {'examples':>9} {'seconds':>8} {'ex/s':>7} {'found':>5} {'added':>5}"]
        for name, t in self.tally.items():
            rate = t.examples / t.seconds if t.seconds else 0.0
            lines.append(f"{name:<8} {t.examples:>9} {t.seconds:>8.1f} {rate:>7.1f} {len(t.found):>5} {len(t.added):>5}")
            lines += [f"    {sig}" for sig in t.found]
            lines += [f"    + {p.relative_to(HERE.parent.parent)}" for p in t.added]
        return "\n".join(lines)
