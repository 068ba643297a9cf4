"""The user's relay secret: what a TCP peer proves it holds before the relay takes anything from it
(docs/security.md, "The relay secret": where it is made and found). Neither side ever sends it:
both derive CURVE key pairs from it (``curve_keys``).
"""
from __future__ import annotations

import base64
import errno
import functools
import hashlib
import hmac
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

ENV = "RELAY_SECRET"
FILE_ENV = "RELAY_SECRET_FILE"
MIN_LENGTH = 16  # characters: a secret shorter than this is refused
#: How to give a process the relay's secret, as every message about a missing or wrong one says.
SHARE = (f"give it the relay's: {ENV}=\"$(cat ~/.config/metrics-relay/secret)\" "
         f"as read on the relay's machine, or {FILE_ENV}=PATH of a file both see "
         "(docs/security.md)")


class SecretError(ValueError):
    """The secret cannot be used; the message is one line that names the fix."""


@dataclass(frozen=True)
class Secret:
    value: bytes
    source: str  # what messages name: $RELAY_SECRET or the file's path


def default_path() -> Path:
    """Where the secret lives unless told otherwise: the user's config folder."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "metrics-relay" / "secret"


def find(path: Path | None = None) -> Secret:
    """``path`` (a relay's --secret-file) first, then $RELAY_SECRET, then $RELAY_SECRET_FILE, then
    the default file. A file that does not exist yet is created: first use."""
    if path is None:
        value = os.environ.get(ENV)
        if value is not None:
            value = value.strip()
            if len(value) < MIN_LENGTH:
                raise SecretError(f"${ENV} holds {len(value)} characters, fewer than {MIN_LENGTH}: "
                                  f"{SHARE}, or unset it to use {default_path()}")
            return Secret(value.encode(), f"${ENV}")
        named = os.environ.get(FILE_ENV)
        path = Path(named).expanduser() if named else default_path()
    return _read_or_create(Path(path))


def _read_or_create(path: Path) -> Secret:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _create(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: the name is a symbolic link
            raise SecretError(_link(path)) from None
        raise SecretError(f"cannot read the relay secret {path}: {exc.strerror}; fix it or point "
                          f"{FILE_ENV} elsewhere") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"the relay secret {path} is not a regular file; "
                              "remove it to have one made")
        if info.st_uid != os.geteuid():
            raise SecretError(f"the relay secret {path} belongs to another user; "
                              "remove it to have one made, or copy your relay's")
        if info.st_mode & 0o077:
            raise SecretError(f"the relay secret {path} can be read by other users (mode "
                              f"{stat.S_IMODE(info.st_mode):o}); chmod 600 {path}")
        value = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(value) < MIN_LENGTH:
        raise SecretError(f"the relay secret {path} holds {len(value)} characters, "
                          f"fewer than {MIN_LENGTH}; remove it to have a new one made, "
                          "or copy your relay's")
    return Secret(value, str(path))


def _link(path: Path) -> str:
    """What to say of a secret whose name is a symbolic link: never followed, since a link could
    hand the relay a file another user controls; one that loops reaches no file at all."""
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):  # ELOOP (RuntimeError on Python 3.11), or a dangling link
        return (f"the relay secret {path} is a symbolic link that never reaches a file (a loop, "
                "or its target is gone); remove it to have a secret made there, or point "
                f"{FILE_ENV} at a real file")
    return (f"the relay secret {path} is a symbolic link (to {target}), which the relay does not "
            f"follow; point {FILE_ENV} at {target} itself, or put the file in the link's place")


def _create(path: Path) -> Secret:
    """A new random secret at ``path``, atomically: written whole beside it, then linked in place,
    so two processes creating it at once agree on the one that was linked first."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)  # left by a process of this pid that died here
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: theirs is the secret
        finally:
            tmp.unlink()
    except OSError as exc:
        raise SecretError(f"cannot create the relay secret {path}: {exc.strerror}; "
                          f"set {FILE_ENV} to a file you can write, or {ENV}") from None
    return _read_or_create(path)


@functools.lru_cache(maxsize=8)
def curve_keys(value: bytes, role: str) -> tuple[bytes, bytes]:
    """The CURVE key pair (public, secret; Z85) of ``role`` ("relay" or "client") under a secret."""
    raw = hmac.new(value, b"metrics-relay curve key v1: " + role.encode(), hashlib.sha256).digest()
    secret = z85.encode(raw)
    return zmq.curve_public(secret), secret
