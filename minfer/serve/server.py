"""Running the app: uvicorn in the foreground (the command line) or in a background thread (tests, notebooks).

Both stop the same way, gracefully: no new connections; the requests in flight get ``shutdown_timeout``
seconds to finish; whatever is still running then is aborted -- its client receives a last event with
finish reason ``"abort"`` and ``[DONE]``, not a cut connection -- and the engine loop stops. On the command
line Ctrl+C (SIGINT) or SIGTERM starts this; a second Ctrl+C quits at once, without waiting for the drain:
exit status 130 (the shell's "ended by SIGINT"), one line on stderr, no traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import uvicorn

from minfer.serve.app import create_app
from minfer.serve.loop import EngineLoop

log = logging.getLogger("minfer.serve")

class Server(uvicorn.Server):
    """uvicorn's server, draining the engine's requests before it closes connections."""

    def __init__(self, config: uvicorn.Config, loop: EngineLoop, shutdown_timeout: float = 5.0) -> None:
        super().__init__(config)
        self.engine_loop, self.shutdown_timeout = loop, shutdown_timeout

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # stop accepting connections now, not after the drain
            server.close()
        await self.engine_loop.drain(self.shutdown_timeout)
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler (main thread only). The first Ctrl+C starts the drain; the second ends the
        process now -- ``os._exit``, because the engine's worker thread may be inside a forward pass that
        nothing can interrupt, and a normal exit would wait for it."""
        if self.should_exit and sig == signal.SIGINT:
            sys.stderr.write("minfer: second Ctrl+C: quitting now, without draining\n")
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(130)
        if not self.should_exit:
            log.info("draining requests in flight for up to %s s (Ctrl+C again quits at once)",
                     self.shutdown_timeout)
        super().handle_exit(sig, frame)


def make_server(engine: Any, host: str = "127.0.0.1", port: int = 8000, *,
                served_model: str | Sequence[str] | None = None,
                shutdown_timeout: float = 5.0, log_level: str = "info", access_log: bool = True,
                **app_options: Any) -> Server:
    """An ``EngineLoop`` over ``engine``, the app over the loop, and the uvicorn server over the app."""
    loop = EngineLoop(engine)
    app = create_app(loop, served_model, **app_options)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            timeout_graceful_shutdown=max(1, int(shutdown_timeout) + 1), lifespan="on")
    return Server(config, loop, shutdown_timeout)


class ServerThread:
    """The same server in a background thread of this process, so the engine stays reachable::

        with ServerThread(engine) as server:       # port 0: a free port
            client = openai.OpenAI(base_url=server.url, api_key="none")
            ...
            server.loop.engine.trace               # the served run, as the engine saw it
    """

    def __init__(self, engine: Any, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        options.setdefault("log_level", "warning")
        options.setdefault("access_log", False)
        self.host = host
        self.server = make_server(engine, host, port, **options)
        self.loop = self.server.engine_loop
        self._thread = threading.Thread(target=self.server.run, name="minfer-server", daemon=True)

    def start(self, timeout: float = 60.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (is the port taken? see the log above)")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown (see the module docstring); returns when the server thread has ended."""
        self.server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the server did not stop within {timeout} s")

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
