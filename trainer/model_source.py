"""Where ``--model_name_or_path`` (and ``--tokenizer_name_or_path``) point, checked before anything
starts: a model the job cannot load used to start the relay, retry the hub five times and end in a
long traceback a minute later; now it is one line and exit status 2 (docs/trainer.md, "Bad input:
one line, exit 2, before any model loads", says which paths and hub ids pass).

Online, an id the cache lacks is asked about once (no retries); one the hub has is left to
``from_pretrained`` to download. ``huggingface_hub`` is imported only for a hub id.
"""
from __future__ import annotations

import os

from trainer.errors import UsageError

FLAGS = ("model_name_or_path", "tokenizer_name_or_path")
#: Files one of which a cached model or tokenizer holds.
_CACHED_FILES = ("config.json", "tokenizer_config.json", "tokenizer.json")
_TRUE = {"1", "on", "yes", "true"}
#: Seconds the one question to the hub about an uncached model may take.
HUB_TIMEOUT_S = 10.0


def check_source(flag: str, value: str) -> None:
    """UsageError unless ``value`` (given as ``--flag``) is a folder or a hub id the job can
    load."""
    path = os.path.expanduser(value)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip(os.sep))
    a_path = value.startswith(("/", "./", "../", "~")) or os.path.exists(path)
    if a_path or (parent and os.path.isdir(parent)):
        what = "is not a folder" if os.path.exists(path) else "does not exist"
        raise UsageError(f"--{flag}: {value} {what}; give the folder that holds the model "
                         "(its config.json)")
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        raise UsageError(f"--{flag}: {value} is neither a folder nor a Hugging Face model id "
                         "(ORG/NAME); give the folder that holds the model") from None
    if any(isinstance(try_to_load_from_cache(value, name), str) for name in _CACHED_FILES):
        return
    if not offline():
        _ask_the_hub(flag, value)
        return
    raise UsageError(f"--{flag}: {value} is no folder here, and the Hugging Face cache holds no "
                     f"model {value!r} (the hub is off: HF_HUB_OFFLINE); give the model's folder, "
                     f"or download it first (hf download {value})")


def _ask_the_hub(flag: str, value: str) -> None:
    """One question to the hub (no retries, HUB_TIMEOUT_S at most) about a model the cache lacks:
    from_pretrained would otherwise retry for a minute and end in a traceback."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(value, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise UsageError(f"--{flag}: {value} is a gated model on the Hugging Face hub; accept its "
                         "terms on huggingface.co and log in (hf auth login), or give a folder "
                         "that holds it") from None
    except RepositoryNotFoundError:
        raise UsageError(f"--{flag}: the Hugging Face hub has no model {value!r} (or it is "
                         "private: hf auth login); check the id, or give the folder that holds the "
                         "model") from None
    except Exception as exc:
        # the network's own errors (DNS, connection, timeout): said, and the job stops
        said = " ".join(str(exc).split())[:200]
        raise UsageError(f"--{flag}: cannot ask the Hugging Face hub about {value} "
                         f"({type(exc).__name__}: {said}); give the model's folder, or set "
                         "HF_HUB_OFFLINE=1 and download it where the hub is reachable "
                         "(hf download)") from None


def check_command_line(argv: list[str]) -> None:
    """``check_source`` for the model and tokenizer flags of a command line, before it is parsed
    (parsing imports transformers and trl: seconds), so a wrong model id costs a moment."""
    wanted = {f"--{flag}": flag for flag in FLAGS}
    wanted |= {f"--{flag.replace('_', '-')}": flag for flag in FLAGS}
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in wanted and (eq or i + 1 < len(argv)):
            check_source(wanted[name], value if eq else argv[i + 1])


def offline() -> bool:
    """Whether the Hugging Face hub is off for this process, as huggingface_hub reads it."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
