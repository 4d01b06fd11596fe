"""Warm-up before the server takes requests (`serve --warm-up-voices`, default alloy).

Each listed voice (`VOICE`, or `VOICE:LANGUAGE` for requests that name a language: the language
is part of the cached prefix; without one, `auto`, as OpenAI clients send) speaks a short text on
every served model it fits, through the same engine path as a request. The first real request then
finds the runtimes' first-call costs paid (llama.cpp's graph and the pages of its memory-mapped
weights, ONNX Runtime's first runs) and that voice's prompt prefix (role, speaker and language rows)
in the engine's prefix cache, so only its text is prefilled. It runs in the app's lifespan, before
uvicorn opens its port, so no client waits on it and `/ready` is only ever answered by a warm server.
A voice that fits no model is logged and skipped; a warm-up that fails is logged and does not stop the
server (`/ready` reports engine health).

`all` stands for every voice of each model: its built-in speakers, then the saved voice profiles that
fit it, as many as its prefix cache holds (`serve --prefix-cache`; more would evict each other). Each
speaks, so a server warming nine speakers starts a few seconds later (`docs/deploy.md`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from qwen3_tts_gguf import SynthesisRequest, VoiceSpec

from api.errors import APIError
from api.registry import ServedModel
from api.state import AppState
from api.voice_resolution import resolve_voice

log = logging.getLogger("api.speaking.warm_up")

TEXT = "Hello."
FRAMES = 2  # enough to run every stage once: talker, code predictor, codec
TIMEOUT_S = 120.0  # per voice and model: a first call on a cold disk can take a while
ALL = "all"


async def warm_up(state: AppState, voices: Sequence[str]) -> int:
    """Speak TEXT in each voice on each served model it fits; returns how many warm-ups finished."""
    done = 0
    for name in voices:
        if name == ALL:
            for served in state.registry.models:
                for voice_name, voice in every_voice(state, served):
                    done += await _speak(served, voice_name, voice)
            continue
        fitted = [(served, voice) for served in state.registry.models
                  if (voice := _resolve(state, served, *split_voice(name))) is not None]
        if not fitted:
            log.info("warm-up: voice %s fits no served model; skipped", name)
        for served, voice in fitted:
            done += await _speak(served, name, voice)
    return done


def every_voice(state: AppState, served: ServedModel) -> list[tuple[str, VoiceSpec]]:
    """What `all` warms on one model: its speakers, then the profiles that fit it, language auto; at
    most as many as its prefix cache holds (at least one, for the runtimes' first calls)."""
    names = [*served.manifest.speakers, *(entry["id"] for entry in state.voice_profiles.entries())]
    fitted = [(name, voice) for name in names if (voice := _resolve(state, served, name, None)) is not None]
    room = max(1, served.engine.prefix_slots)
    if len(fitted) > room:
        log.info("warm-up: model %s has %d voices and a prefix cache of %d; warming %s (serve --prefix-cache)",
                 served.id, len(fitted), room, ", ".join(name for name, _ in fitted[:room]))
    return fitted[:room]


def split_voice(entry: str) -> tuple[str, str | None]:
    """"ryan:english" -> ("ryan", "english"); "ryan" -> ("ryan", None)."""
    voice, _, language = entry.partition(":")
    return voice, language or None


def _resolve(state: AppState, served: ServedModel, voice: str, language: str | None) -> VoiceSpec | None:
    try:
        return resolve_voice(served.manifest, voice, None, language, state.voice_profiles).spec
    except APIError:
        return None


async def _speak(served: ServedModel, name: str, voice: VoiceSpec) -> bool:
    """One short utterance through the engine, its audio dropped; False (logged) when it failed."""
    start = time.perf_counter()
    request = SynthesisRequest(text=TEXT, voice=voice, max_frames=FRAMES, seed=0, ignore_eos=True)
    stream = None
    try:
        async with asyncio.timeout(TIMEOUT_S):
            stream = await asyncio.to_thread(served.engine.submit, request, asyncio.get_running_loop())
            async for _ in stream:
                pass
    except Exception as e:  # the server starts anyway: /ready tells whether the engine is healthy
        if stream is not None:
            stream.cancel()
        log.warning("warm-up: voice %s on model %s failed: %s", name, served.id,
                    f"no audio within {TIMEOUT_S:g} s" if isinstance(e, TimeoutError) else e)
        return False
    if stream.result.error:
        log.warning("warm-up: voice %s on model %s failed: %s", name, served.id, stream.result.error)
        return False
    log.info("warm-up: voice %s on model %s in %.2f s", name, served.id, time.perf_counter() - start)
    return True
