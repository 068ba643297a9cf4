"""How a relay reaches NATS: the options (docs/sinks/nats.md, "Options"), their checks and the
connection.

Whatever is wrong without a server is a one-line SinkError before the relay listens; ``probe()``
tells credentials refused (SinkError) from a server not reachable now (None: waited for, not fatal).
"""
from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from sinks.base import SinkError

if TYPE_CHECKING:  # ssl is imported where used: every relay builds these options as it starts
    import ssl

log = logging.getLogger(__name__)

INSTALL = "pip install 'metrics-relay[nats]'"
SCHEMES = ("nats", "tls")
DEFAULT_URL = "nats://127.0.0.1:4222"
PASSWORD_ENV, TOKEN_ENV = "NATS_PASSWORD", "NATS_TOKEN"  # the options' environment variables


def nats_options() -> list[click.Option]:
    """The connection options, shared by the ``nats`` sink and the relay that consumes a stream."""
    return [
        click.Option(["--nats-url"], metavar="nats://HOST:4222[,nats://...]", default=DEFAULT_URL,
                     show_default=True,
                     help="The NATS servers (several, comma-separated, for a cluster); "
                          "user:password@ may be in the URL; tls:// asks for TLS."),
        click.Option(["--nats-user"], default=None, help="User name (or give it in the URL)."),
        click.Option(["--nats-password"], default=None, envvar=PASSWORD_ENV,
                     help="Password for --nats-user (or $NATS_PASSWORD, or in the URL)."),
        click.Option(["--nats-token"], default=None, envvar=TOKEN_ENV,
                     help="Auth token (or $NATS_TOKEN)."),
        click.Option(["--nats-creds"], metavar="FILE", default=None,
                     help="A .creds file (user JWT and nkey seed), as `nsc` writes it."),
        click.Option(["--nats-nkey"], metavar="FILE", default=None,
                     help="A file holding a user nkey seed (SU...)."),
        click.Option(["--nats-tls-ca"], metavar="FILE", default=None,
                     help="CA certificate to verify the servers with (TLS)."),
        click.Option(["--nats-tls-cert"], metavar="FILE", default=None,
                     help="Client certificate, for servers that verify clients (with "
                          "--nats-tls-key)."),
        click.Option(["--nats-tls-key"], metavar="FILE", default=None,
                     help="Client certificate's private key."),
    ]


@dataclass
class NatsSettings:
    """Checked connection settings: what ``connect_kwargs`` turns into nats-py's arguments."""

    servers: list[str]
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def display(self) -> str:
        """The servers without any password in them, for logs and errors."""
        return ",".join(_without_secret(s) for s in self.servers)

    @property
    def wants_tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert) \
            or any(s.startswith("tls://") for s in self.servers)


def settings_from_options(nats_url: str | None = DEFAULT_URL, nats_user: str | None = None,
                          nats_password: str | None = None, nats_token: str | None = None,
                          nats_creds: str | None = None, nats_nkey: str | None = None,
                          nats_tls_ca: str | None = None, nats_tls_cert: str | None = None,
                          nats_tls_key: str | None = None) -> NatsSettings:
    """The options of ``nats_options()`` checked; SinkError (one line, exit 2) for what is wrong."""
    servers = [s.strip() for s in (nats_url or "").split(",") if s.strip()]
    if not servers:
        raise SinkError(f"--nats-url is empty; give the NATS servers, as {DEFAULT_URL}")
    for server in servers:
        _check_url(server)
    in_url = any("@" in server for server in servers)
    # A credential read from the environment (exported for the servers' config, say) yields to one
    # given on the command line or in the URL; an error names the variable it was read from.
    password_env = _from_env(nats_password, PASSWORD_ENV)
    token_env = _from_env(nats_token, TOKEN_ENV)
    if password_env and not nats_user and (nats_token or nats_creds or nats_nkey or in_url):
        nats_password = password_env = None
    if token_env and (nats_user or nats_creds or nats_nkey or in_url):
        nats_token = token_env = None
    if nats_password and not nats_user:
        raise SinkError(f"${PASSWORD_ENV} is set, and read as --nats-password, but no "
                        f"--nats-user is given; give --nats-user NAME (or another way to "
                        f"authenticate), or unset {PASSWORD_ENV}"
                        if password_env else "--nats-password needs --nats-user")
    token = f"--nats-token (${TOKEN_ENV})" if token_env else "--nats-token"
    ways = (("--nats-user", nats_user), (token, nats_token), ("--nats-creds", nats_creds),
            ("--nats-nkey", nats_nkey))
    kinds = [name for name, given in ways if given]
    if len(kinds) > 1:
        raise SinkError(f"{' and '.join(kinds)} are two ways to authenticate; give one")
    for option, path in (("--nats-creds", nats_creds), ("--nats-nkey", nats_nkey),
                         ("--nats-tls-ca", nats_tls_ca), ("--nats-tls-cert", nats_tls_cert),
                         ("--nats-tls-key", nats_tls_key)):
        if path and not Path(path).expanduser().is_file():
            raise SinkError(f"{option} {path}: no such file; give the path of the file")
    if bool(nats_tls_cert) != bool(nats_tls_key):
        raise SinkError("--nats-tls-cert and --nats-tls-key go together; give both")
    if nats_nkey and not Path(nats_nkey).expanduser().read_text().strip().startswith("SU"):
        raise SinkError(f"--nats-nkey {nats_nkey}: not a user nkey seed (it starts with SU); "
                        "give the file `nsc` or `nk -gen user` wrote")
    def expand(p: str | None) -> str | None:
        return str(Path(p).expanduser()) if p else None

    return NatsSettings(servers=servers, user=nats_user, password=nats_password, token=nats_token,
                        creds=expand(nats_creds), nkey=expand(nats_nkey),
                        tls_ca=expand(nats_tls_ca), tls_cert=expand(nats_tls_cert),
                        tls_key=expand(nats_tls_key))


def _from_env(value: str | None, variable: str) -> str | None:
    """``variable``'s name when ``value`` is what it holds (click read the option from it)."""
    return variable if value and value == os.environ.get(variable) else None


def _check_url(server: str) -> None:
    try:
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in SCHEMES or not parts.hostname \
            or parts.path not in ("", "/"):
        raise SinkError(f"--nats-url {_without_secret(server)!r} is not a NATS server URL; "
                        f"give nats://HOST:PORT (or tls://), several comma-separated")
    if port == 0:
        raise SinkError(f"--nats-url {_without_secret(server)!r} has port 0; give the server's "
                        "port (4222 by default)")


def _without_secret(server: str) -> str:
    if "@" not in server:
        return server
    scheme, _, rest = server.rpartition("://")
    return f"{scheme + '://' if scheme else ''}***@{rest.rsplit('@', 1)[1]}"


def check_package() -> None:
    """SinkError unless nats-py can be imported (found, not imported: that is for the sink's
    process)."""
    try:
        found = importlib.util.find_spec("nats") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise SinkError(f"NATS needs the nats-py package, which is not installed; {INSTALL}")


def tls_context(settings: NatsSettings) -> ssl.SSLContext | None:
    """The TLS context the settings ask for (None: plain TCP). SinkError for files that are not
    certificates."""
    if not settings.wants_tls:
        return None
    import ssl
    try:
        ctx = ssl.create_default_context(cafile=settings.tls_ca)
        if settings.tls_cert:
            ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (ssl.SSLError, OSError) as exc:
        raise SinkError(f"--nats-tls-*: cannot load the certificates: {exc}; give PEM "
                        "files") from None
    return ctx


def connect_kwargs(settings: NatsSettings) -> dict[str, Any]:
    """nats.connect()'s keyword arguments for these settings (without the callbacks)."""
    kwargs: dict[str, Any] = {"servers": list(settings.servers), "tls": tls_context(settings)}
    if settings.user:
        kwargs.update(user=settings.user, password=settings.password or "")
    if settings.token:
        kwargs["token"] = settings.token
    if settings.creds:
        kwargs["user_credentials"] = settings.creds
    if settings.nkey:
        kwargs["nkeys_seed"] = settings.nkey
    kwargs.update(settings.extra)
    return kwargs


def backoff(first: float, longest: float) -> Iterator[float]:
    """Waits between attempts: ``first``, doubling up to ``longest``, for ever."""
    wait = first
    while True:
        yield wait
        wait = min(longest, wait * 2)


def describe(exc: BaseException) -> str:
    """An exception from nats-py in a few words (several of its errors have an empty str())."""
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text and name not in text else (text or name)


def failures() -> tuple[type[Exception], ...]:
    """What nats-py raises when the servers are away, slow or refuse us: its own errors and a
    socket's OSError (its timeouts and asyncio's are both; nats-py's own client catches these).
    What ``except`` names around its calls, so that a bug of ours is not taken for NATS away."""
    from nats.errors import Error
    return (Error, OSError)


def refused(exc: BaseException) -> bool:
    """True for the servers refusing who we are (credentials, TLS), which retrying does not mend."""
    import ssl

    from nats import errors
    if isinstance(exc, (errors.AuthorizationError, errors.InvalidUserCredentialsError,
                        errors.SecureConnRequiredError, errors.SecureConnWantedError,
                        ssl.SSLError)):
        return True
    text = str(exc).lower()
    return "authorization" in text or "authentication" in text or "user credentials" in text


async def connect(settings: NatsSettings, *, retry_forever: bool = True, timeout: float = 2.0,
                  on_error: Callable[[Exception], Awaitable[None]] | None = None,
                  **callbacks: Any) -> Any:
    """A nats-py client. ``retry_forever``: wait for the servers however long they are away (at
    start too) and reconnect after any loss; else one attempt at each server, raising what
    failed."""
    import nats

    async def errors(exc: Exception) -> None:
        if on_error is not None:
            await on_error(exc)
        else:
            log.debug("NATS %s: %s", settings.display, describe(exc))

    return await nats.connect(**connect_kwargs(settings), connect_timeout=timeout, error_cb=errors,
                              allow_reconnect=retry_forever,
                              max_reconnect_attempts=-1 if retry_forever else 1,
                              reconnect_time_wait=0.5, **callbacks)


async def probe(settings: NatsSettings, timeout: float = 3.0) -> str | None:
    """One attempt to connect: SinkError when the servers refuse these credentials (or TLS); the
    reason as a string when none is reachable now; None when connected (and closed again)."""
    try:
        nc = await connect(settings, retry_forever=False, timeout=timeout)
    except SinkError:
        raise
    except failures() as exc:  # refused, or not reachable now: sorted here
        if refused(exc):
            raise SinkError(f"--nats-url {settings.display}: the server refused the connection: "
                            f"{describe(exc)}; check --nats-user/--nats-password, --nats-token, "
                            "--nats-creds or --nats-nkey") from None
        return describe(exc)
    await nc.close()
    return None
