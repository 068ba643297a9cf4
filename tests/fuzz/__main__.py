"""``python -m tests.fuzz --seconds N [--target a|b|c|decode|ingest|journal|all]`` (``make fuzz``)."""
from __future__ import annotations

import argparse
import logging
import sys
import warnings

from hypothesis.errors import HypothesisWarning

from .runner import Session
from .targets import TARGETS, ingest_available


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0, help="how long to fuzz, all targets together")
    names = sorted(TARGETS) + sorted(t.alias for t in TARGETS.values()) + ["all"]
    parser.add_argument("--target", choices=names, default="all", help="one target (by name or letter), or all")
    args = parser.parse_args(argv)

    warnings.simplefilter("ignore", HypothesisWarning)  # "overly large repr" of big frames: we print our own
    logging.basicConfig(level=logging.CRITICAL)  # the relay logs every frame it rejects: silence it
    log = logging.getLogger("fuzz")
    log.propagate = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    targets = [t for t in TARGETS.values() if args.target in ("all", t.name, t.alias)]
    if not ingest_available() and any(t.name == "ingest" for t in targets):
        log.warning("ingest: relay.daemon.ingest.Ingest has no take_frame/commit yet; skipping that target")
        targets = [t for t in targets if t.name != "ingest"]
    session = Session(targets, log)
    session.replay_corpus()
    try:
        session.run(args.seconds)
    except KeyboardInterrupt:
        log.warning("interrupted")
    print(session.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
