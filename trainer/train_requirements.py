"""Whether this environment can run ``python -m trainer``: the ``[train]`` extra's libraries at the
versions it names (transformers 5, trl 1: their APIs differ from 4.x and 0.x). An environment pinned
to older ones, fms-hf-tuning 3.2.2's (transformers 4.55, trl 0.19), gets one line naming what is
needed and the way in that works there (the one-line callback), not a traceback from deep in
argparse. Read from the installed package's own metadata, so the versions are pyproject.toml's."""
from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement

from trainer.errors import UsageError

DISTRIBUTION = "metrics-relay"


def check_train_requirements() -> None:
    """UsageError naming each ``[train]`` requirement the environment does not meet; nothing when
    the package is not installed (a checkout on PYTHONPATH) or every requirement holds."""
    try:
        required = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return
    unmet = []
    for text in required:
        requirement = Requirement(text)
        if requirement.marker is None or not requirement.marker.evaluate({"extra": "train"}):
            continue
        try:
            have = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{requirement} (not installed)")
            continue
        if not requirement.specifier.contains(have, prereleases=True):
            unmet.append(f"{requirement.name}{requirement.specifier} (this environment has {have})")
    if unmet:
        raise UsageError(f"python -m trainer needs {', '.join(unmet)}: install './[train]', or add "
                         "RelayCallback() to your own Trainer at your pins (docs/trainer.md, One "
                         "line in any Trainer)")
