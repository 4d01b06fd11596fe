"""Run an app on a real uvicorn server inside this process (tests, benchmarks, demos).

    with ServerThread(create_app(config, registry)) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="...")
"""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

from api.config import ServerConfig
from api.ops.connections import uvicorn_config


class ServerThread:
    """uvicorn on 127.0.0.1 and a free port, in a daemon thread; a context manager.

    It runs with the settings `serve` uses (`connections.uvicorn_config`: header timeout, connection
    limit, root path, TLS) for `config`, by default the app's own `ServerConfig`; `uvicorn_settings`
    override uvicorn's (`lifespan="off"`: a second listener on an app another one runs).
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", log_level: str = "warning",
                 startup_timeout_s: float = 60.0, config: ServerConfig | None = None, **uvicorn_settings: object):
        self.app = app
        if config is None:
            state = getattr(app.state, "qtts", None)
            config = state.config if state is not None else ServerConfig()
        self.config = config
        self.server = uvicorn.Server(uvicorn_config(app, config, host=host, port=0, log_level=log_level,
                                                   timeout_graceful_shutdown=2, **uvicorn_settings))
        self._thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)
        self._timeout = startup_timeout_s
        self.host = host
        self.port = 0

    @property
    def url(self) -> str:
        return f"{self.config.scheme}://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        """The OpenAI SDK's base_url."""
        return f"{self.url}/v1"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + self._timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server stopped during startup (see its log)")
            if time.monotonic() > deadline:
                self.server.should_exit = True
                raise TimeoutError("the server did not start in time")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
