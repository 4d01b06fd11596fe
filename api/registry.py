"""The models a server speaks with, one Engine each, and how a request's `model` picks one.

Model ids are manifest names; a model's folder name is accepted too. The first model is the
default, and OpenAI's TTS model ids are aliases of it, so clients that hard-code `tts-1` work.

The registry also supervises its engines (`Supervisor`): a worker that died is restarted (its
streams were failed when it died); after `max_restarts` within `window_s`, or a worker that made
no progress for `stall_s` while it had work (stuck inside a model call, where no thread can be
stopped), the engine is given up: `/ready` and `/health` then answer 503, so an orchestrator's
liveness probe replaces the process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qwen3_tts_gguf import Engine, EngineHealth, EngineSettings, LoadedModel, Manifest
from qwen3_tts_gguf.model.manifest import MANIFEST

from api.errors import model_not_found

log = logging.getLogger("api.registry")

OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-03-20",
                        "gpt-4o-mini-tts-2025-12-15")
"""OpenAI's speech model ids, snapshots included: every one the openai SDK names (a test checks)."""


@dataclass
class ServedModel:
    """One loaded model and the engine that batches its requests."""

    id: str
    model: LoadedModel
    engine: Engine
    created: int
    """Unix time the model folder was written (the `created` field of /v1/models)."""

    @property
    def manifest(self) -> Manifest:
        return self.model.manifest

    @property
    def folder(self) -> Path:
        return self.model.folder


@dataclass
class SupervisionPolicy:
    """How the registry watches its engines."""

    interval_s: float = 0.5
    """How often each engine's health is checked."""
    max_restarts: int = 3
    """Restarts allowed within `window_s` before the engine is given up."""
    window_s: float = 300.0
    stall_s: float = 600.0
    """A worker with work that shows no progress for this long is stuck: given up."""


@dataclass
class _Watch:
    restarts: deque = field(default_factory=deque)


class ModelRegistry:
    """Served models by id, alias and folder name; starts, stops and supervises their engines."""

    def __init__(self, models: Sequence[ServedModel], policy: SupervisionPolicy | None = None):
        if not models:
            raise ValueError("a registry needs at least one model")
        self.models: tuple[ServedModel, ...] = tuple(models)
        self._by_name: dict[str, ServedModel] = {}
        for served in self.models:
            self._by_name.setdefault(served.id, served)
        for served in self.models:
            self._by_name.setdefault(served.folder.name, served)
        for alias in OPENAI_MODEL_ALIASES:
            self._by_name.setdefault(alias, self.default)
        self._running = False
        self.policy = policy or SupervisionPolicy()
        self._watch = {served.id: _Watch() for served in self.models}
        self._stop_watching = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def load(cls, folders: Iterable[str | Path], settings: EngineSettings) -> ModelRegistry:
        """Open every model folder (ModelFolderError/OSError on a bad one); engines not started yet."""
        served: list[ServedModel] = []
        try:
            for folder in folders:
                model = LoadedModel(folder, settings)
                served.append(ServedModel(id=_unique_id(model, served), model=model, engine=Engine(model),
                                          created=int((model.folder / MANIFEST).stat().st_mtime)))
                predictor = (f"{model.manifest.code_predictor.get('precision', 'fp32')} {model.predictor_file}"
                             if model.runtimes.predictor == "onnxruntime" else "on the project's ggml graphs")
                log.info("loaded %s (%s %s, %s; code predictor %s; codec on %s) from %s", served[-1].id,
                         model.manifest.model_type, model.manifest.model_size, model.manifest.quant, predictor,
                         model.runtimes.codec, model.folder)
        except BaseException:
            for s in served:
                s.model.close()
            raise
        return cls(served)

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    @property
    def aliases(self) -> tuple[str, ...]:
        """OpenAI ids that name the default model (those no served model took as its own id)."""
        return tuple(a for a in OPENAI_MODEL_ALIASES if self._by_name[a] is self.default)

    def resolve(self, model_id: str) -> ServedModel:
        """The model a request names; APIError 404 when none has that id, alias or folder name."""
        served = self._by_name.get(model_id)
        if served is None:
            raise model_not_found(model_id, [m.id for m in self.models] + list(self.aliases))
        return served

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        for served in self.models:
            served.engine.start()
        self._running = True
        self._stop_watching.clear()
        self._watcher = threading.Thread(target=self._supervise, name="qtts-supervisor", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop every engine; streams still running end as `cancelled`."""
        self._running = False
        self._stop_watching.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        for served in self.models:
            served.engine.stop()

    def health(self) -> list[tuple[ServedModel, EngineHealth]]:
        """Each model's engine health (running, stopped, failed = restarting, dead = given up)."""
        return [(served, served.engine.health()) for served in self.models]

    def _supervise(self) -> None:
        while not self._stop_watching.wait(self.policy.interval_s):
            for served in self.models:
                self.check(served)

    def check(self, served: ServedModel) -> None:
        """One supervision step for one engine: restart a dead worker, give up a hopeless one."""
        engine, policy = served.engine, self.policy
        health = engine.health()
        now = time.monotonic()
        if health.status == "running":
            busy = engine.load()["active"] > 0
            if busy and now - engine.heartbeat > policy.stall_s:
                engine.give_up(f"the engine worker made no progress for {policy.stall_s:.0f} s")
            return
        if health.status != "failed":
            return
        restarts = self._watch[served.id].restarts
        while restarts and now - restarts[0] > policy.window_s:
            restarts.popleft()
        if len(restarts) >= policy.max_restarts:
            engine.give_up(f"the engine failed {len(restarts) + 1} times within {policy.window_s:.0f} s")
            return
        restarts.append(now)
        try:
            engine.restart()
        except Exception:
            log.exception("restarting the engine of %s failed", served.id)

    def close(self) -> None:
        self.stop()
        for served in self.models:
            served.model.close()


def _unique_id(model: LoadedModel, taken: Sequence[ServedModel]) -> str:
    """The manifest name, or the folder name when another model already uses that name."""
    used = {s.id for s in taken}
    for candidate in (model.manifest.name, model.folder.name):
        if candidate not in used:
            return candidate
    raise ValueError(f"{model.folder}: a model named {model.manifest.name!r} is already served; "
                     "rename one of the folders")
