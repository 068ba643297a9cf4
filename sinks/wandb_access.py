"""What the wandb sink needs from its environment: the wandb package (and the errors that mean its
wandb-core is gone), and, online, credentials where wandb looks for them."""
from __future__ import annotations

import netrc
import os
import urllib.parse
from typing import Any

from sinks.preflight import tool_import


def import_wandb() -> tuple[Any, tuple[type[Exception], ...]]:
    """wandb and the errors that mean its wandb-core is gone; or how to get it (the ``[wandb]``
    extra)."""
    with tool_import("wandb", "wandb"):
        import wandb
        from wandb.sdk.mailbox import MailboxClosedError
    return wandb, (ConnectionError, MailboxClosedError)


def api_key_present() -> bool:
    """Whether wandb would find an API key: $WANDB_API_KEY, or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    base_url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = urllib.parse.urlparse(base_url).hostname or ""
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
