"""The server tests' `registry` and `server` fixtures, made by factories: a test file says in one line which
models, engine settings and server configuration it tests, e.g.

    registry, server = server_fixtures(MAX_STREAMS)   # the tiny CustomVoice model, ws_settings, key KEY
    registry = registry_fixture(settings=EngineSettings(threads=1, max_streams=2))
    server = server_fixture(scope="function")         # a server of its own per test, on `registry`

pytest finds a fixture by the name it was made with, in whatever module variable it stands. A file whose
fixtures are its own (a parametrised server, a test double, a fixture that yields several things) writes
them out.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from qwen3_tts_gguf.model.settings import EngineSettings

from api import ServerConfig, create_app
from api.testing import ServerThread
from tests.ws_helpers import KEY, loaded_registry, ws_settings

__all__ = ["FixtureValue", "registry_fixture", "server_fixture", "server_fixtures", "short_stream_registries"]


@dataclass(frozen=True)
class FixtureValue:
    """A ServerConfig value that is the fixture `name`'s value (the server fixture asks for that fixture):
    `voices_dir=FixtureValue("voices_dir")`."""

    name: str


def _fixture(body: Callable[..., contextlib.AbstractContextManager], needs: Iterable[str], scope: str, name: str):
    """The pytest fixture `name` (`scope`): it asks for the fixtures `needs` (in that order) and yields what
    the context manager `body(**their values)` gives."""
    def fixture(**values: Any):
        with body(**values) as value:
            yield value

    fixture.__signature__ = inspect.Signature(  # how pytest knows which fixtures it asks for
        [inspect.Parameter(need, inspect.Parameter.KEYWORD_ONLY) for need in needs])
    fixture.__name__ = fixture.__qualname__ = name  # as tracebacks and `pytest --fixtures` name it
    return pytest.fixture(scope=scope, name=name)(fixture)


def registry_fixture(max_streams: int | None = None, *, settings: EngineSettings | None = None,
                     models: tuple[str, ...] = ("tiny_cv",), scope: str = "module", name: str = "registry"):
    """The fixture `name`: a ModelRegistry of the converted f32 `models` (the first is the default), with
    `settings` or else the socket tests' `ws_settings(max_streams)`; closed at the end of `scope`."""
    if (settings is None) == (max_streams is None):
        raise TypeError("registry_fixture takes max_streams or settings, one of them")
    if settings is None:
        settings = ws_settings(max_streams)

    def load(converted_factory):
        return loaded_registry([converted_factory(model, "f32") for model in models], settings)

    return _fixture(load, ["converted_factory"], scope, name)


def server_fixture(*, api_key: str | None = KEY, scope: str = "module", name: str = "server",
                   registry: str = "registry", **config: Any):
    """The fixture `name`: a real uvicorn server on the fixture `registry`, whose ServerConfig has `api_key`,
    no web console unless `webui_dir` says, and the other `config` fields (a `FixtureValue` stands for that
    fixture's value)."""
    needs = [registry, *(value.name for value in config.values() if isinstance(value, FixtureValue))]

    def run(**values):
        fields = {field: values[value.name] if isinstance(value, FixtureValue) else value
                  for field, value in config.items()}
        return ServerThread(create_app(ServerConfig(**{"api_key": api_key, "webui_dir": None, **fields}),
                                       values[registry]))

    return _fixture(run, needs, scope, name)


def server_fixtures(max_streams: int | None = None, *, settings: EngineSettings | None = None,
                    models: tuple[str, ...] = ("tiny_cv",), api_key: str | None = KEY,
                    names: tuple[str, str] = ("registry", "server"), **config: Any):
    """The module fixtures `registry` and `server` (or `names`): `registry_fixture(max_streams, settings,
    models)` and a `server_fixture(api_key, **config)` on it."""
    registry, server = names
    return (registry_fixture(max_streams, settings=settings, models=models, name=registry),
            server_fixture(api_key=api_key, name=server, registry=registry, **config))


def short_stream_registries(max_streams: int, max_pending: int):
    """Fixtures `registry` (module) and `own_registry` (one test's own: a server's end stops its
    registry's engines) of the tiny CustomVoice model, deterministic, one thread, whose runaway budget
    (6 frames + 1 per text token) ends every stream within a few dozen frames: for protocols that
    have no `max_frames` (random weights rarely say EOS)."""
    settings = EngineSettings(threads=1, deterministic=True, max_streams=max_streams, max_pending=max_pending,
                              budget_base_frames=6, budget_frames_per_token=1)
    return (registry_fixture(settings=settings),
            registry_fixture(settings=settings, scope="function", name="own_registry"))
