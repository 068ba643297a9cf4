"""An asyncio event loop on a thread, for callers that are synchronous (a NATS sink's process is).
Apart from relay/fleet/connection.py, whose options every relay builds as it starts: asyncio is
imported only where NATS is used (docs/development.md, "Where the time goes")."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop on its own daemon thread, for synchronous callers: ``run(coro)`` waits
    for the result, ``submit(coro)`` returns a concurrent future."""

    def __init__(self, name: str = "nats-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Have the loop call ``callback(*args)`` (from any thread)."""
        self.loop.call_soon_threadsafe(callback, *args)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the loop, stop it and join the thread."""
        if not self._thread.is_alive():
            return

        async def cancel_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self.run(cancel_rest(), timeout)
        except concurrent.futures.TimeoutError:
            log.warning("NATS loop: tasks still running after %.0fs at stop", timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
