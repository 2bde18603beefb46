"""An asyncio service on a thread of this process, for tests, benchmarks and the sweep's links:

    with Background(serve, "verifier server") as url:    # serve(stop, on_listening) -> coroutine
        ...                                              # url = "HOST:PORT" once it listens

and the verifier server as one (`BackgroundServer`).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from specdec.models.loading import LoadedModel
from specdec.remote.server import VerifierServer
from specdec.remote.server_config import ServeConfig

Serve = Callable[[asyncio.Event, Callable[[str, int], None]], Awaitable[None]]
DEFAULT_SERVE = ServeConfig()  # frozen: one instance is every default server's settings


class Background:
    def __init__(self, serve: Serve, what: str, start_timeout_s: float = 30.0) -> None:
        self.serve, self.what, self.start_timeout_s = serve, what, start_timeout_s
        self.listening = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), name=what, daemon=True)
        self.url = ""

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        await self.serve(self.stop, self._listening)

    def _listening(self, host: str, port: int) -> None:
        self.url = f"{host}:{port}"
        self.listening.set()

    def __enter__(self) -> str:
        self.thread.start()
        if not self.listening.wait(self.start_timeout_s):
            raise RuntimeError(f"the {self.what} did not start listening within {self.start_timeout_s:g} s")
        return self.url

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(self.start_timeout_s)


class BackgroundServer(Background):
    """The server on a thread of this process, for tests and benchmarks:

        with BackgroundServer(model) as url:   # "127.0.0.1:PORT"
            ...
    """

    def __init__(self, model: LoadedModel, config: ServeConfig = DEFAULT_SERVE) -> None:
        self.server = VerifierServer(model, config)
        super().__init__(lambda stop, on_listening: self.server.serve(stop, on_listening), "verifier server")
