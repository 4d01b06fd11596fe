"""Sharing one engine: concurrent clients, the admission queue (429), disconnects, slow readers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

try:  # openai>=3 brings httpx2; older stacks have httpx (same API)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import openai
import pytest

from qwen3_tts_gguf.audio.formats import to_s16
from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.model.settings import EngineSettings

from api import ModelRegistry, ServerConfig, create_app
from api.limits import ServerLimits
from api.testing import ServerThread
from tests.waiting import wait_until

LONG_TEXT = ("This sentence is long enough that the engine would speak for a good while if nobody stopped it, "
             "which is exactly what a disconnecting client should do.")
SPEAKERS = ["ryan", "aiden", "serena", "vivian", "sohee", "ono_anna", "uncle_fu", "ryan"]


def serve(folder, **settings):
    """Every client here is 127.0.0.1: the per-client cap is lifted to play many clients."""
    registry = ModelRegistry.load([folder], EngineSettings(threads=1, deterministic=True, **settings))
    config = ServerConfig(webui_dir=None, limits=ServerLimits(max_requests_per_client=64))
    return registry, ServerThread(create_app(config, registry))




def body(text: str, speaker: str, seed: int, frames: int, fmt: str = "pcm") -> dict:
    return {"model": "tts-1", "input": text, "voice": speaker, "response_format": fmt, "seed": seed,
            "max_frames": frames}


@pytest.fixture(scope="module")
def wide(tiny_cv_f32):
    """Eight slots: concurrent clients and slow readers."""
    registry, server = serve(tiny_cv_f32, max_streams=8, max_pending=8)
    with server:
        yield registry, server
    registry.close()


@pytest.fixture(scope="module")
def narrow(tiny_cv_f32):
    """One slot and a queue of one: the third request is refused."""
    registry, server = serve(tiny_cv_f32, max_streams=1, max_pending=1)
    with server:
        yield registry, server
    registry.close()


def solo_pcm(registry: ModelRegistry, text: str, speaker: str, frames: int) -> bytes:
    """The engine alone, greedy (what `temperature: 0` asks for): talker and code predictor argmax."""
    gen = registry.default.manifest.sampling
    talker = replace(SamplingParams.from_generation_config(gen), greedy=True)
    predictor = replace(SamplingParams.from_generation_config(gen, "subtalker_"), greedy=True)
    request = SynthesisRequest(text=text, voice=VoiceSpec(speaker=speaker), max_frames=frames,
                               talker=TalkerSampling(talker, gen["repetition_penalty"]), code_predictor=predictor)
    stream = registry.default.engine.submit(request)
    return to_s16(np.concatenate([c.samples for c in stream])).astype("<i2").tobytes()


def test_eight_concurrent_clients_get_their_own_audio(wide):
    """Eight clients at once, batched together, each get exactly their solo audio.

    Greedy decoding: the engine's batched output equals its solo output bit for bit (seeded sampling
    beside other streams: tests/test_reproducible.py)."""
    registry, server = wide
    client = openai.OpenAI(base_url=server.api_url, api_key="any", max_retries=0)
    jobs = [(f"Client number {i} says hello.", SPEAKERS[i], 10 + i) for i in range(8)]
    start = threading.Barrier(len(jobs))

    def run(job):
        text, speaker, frames = job
        start.wait()
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", input=text, voice=speaker, response_format="pcm",
                extra_body={"temperature": 0, "max_frames": frames}) as response:
            return b"".join(response.iter_bytes())

    with ThreadPoolExecutor(len(jobs)) as pool:
        bodies = list(pool.map(run, jobs))
    for job, got in zip(jobs, bodies, strict=True):
        assert got == solo_pcm(registry, *job), job


def idle(engine) -> bool:
    load = engine.load()
    return load["active"] == load["waiting"] == load["waiting_text"] == 0 and load["free_slots"] == \
        engine.settings.max_streams


def test_a_slow_reader_stalls_neither_the_engine_nor_others(wide):
    registry, server = wide
    engine = registry.default.engine
    done_before = engine.stats["streams_done"]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/audio/speech", json=body(LONG_TEXT, "ryan", 1, 300, "wav")) as slow:
            assert slow.status_code == 200  # headers came with the first audio; nothing read after that
            quick = http.post("/v1/audio/speech", json=body("Quick one.", "aiden", 2, 6))
            assert quick.status_code == 200 and len(quick.content) == 6 * 1920 * 2
            wait_until(lambda: engine.stats["streams_done"] >= done_before + 2, what="the unread stream to finish")
            assert engine.load()["active"] == 0
            data = slow.read()
    assert len(data) == 44 + 300 * 1920 * 2  # everything arrives once the reader catches up


def test_disconnect_frees_the_slot_and_a_full_queue_answers_429(narrow):
    registry, server = narrow
    engine = registry.default.engine
    cancelled_before = engine.stats["cancelled"]
    frames_before = engine.stats["frames"]
    with httpx.Client(base_url=server.url, timeout=60) as http, ThreadPoolExecutor(1) as pool:
        with http.stream("POST", "/v1/audio/speech", json=body(LONG_TEXT, "ryan", 1, 2000)) as first:
            pieces = first.iter_bytes()  # (keep the iterator: dropping it closes the response)
            next(pieces)  # streaming: it holds the only slot
            assert engine.load()["active"] == 1
            queued = pool.submit(httpx.post, f"{server.url}/v1/audio/speech", json=body("Next.", "aiden", 2, 4),
                                 timeout=60)
            wait_until(lambda: engine.load()["waiting"] == 1, what="the second request to queue")

            client = openai.OpenAI(base_url=server.api_url, api_key="any", max_retries=0)
            with pytest.raises(openai.RateLimitError) as err:
                client.audio.speech.create(model="tts-1", input="Third.", voice="ryan",
                                           extra_body={"max_frames": 4})
            assert err.value.status_code == 429 and err.value.response.headers["retry-after"]
            assert err.value.body["code"] == "queue_full" and err.value.body["type"] == "rate_limit_error"
        # leaving the `with` closed the connection mid-stream
        wait_until(lambda: engine.stats["cancelled"] == cancelled_before + 1, what="the engine to cancel")
        second = queued.result(timeout=30)
    assert second.status_code == 200 and len(second.content) == 4 * 1920 * 2
    wait_until(lambda: idle(engine), what="an idle engine")
    assert engine.stats["frames"] - frames_before < 1000  # the 2000-frame request stopped early
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'qtts_http_requests_total{path="/v1/audio/speech",status="429"} 1' in metrics
    assert 'reason="cancelled"} 1' in metrics


def test_a_client_leaving_while_queued_is_cancelled_too(narrow):
    """The request is cancelled when its client leaves, and never synthesised. (The engine keeps a
    cancelled waiting stream in its queue until a slot frees; see the report on Engine.cancel.)"""
    registry, server = narrow
    engine, metrics = registry.default.engine, server.app.state.qtts.metrics
    done_before, cancelled_before = engine.stats["streams_done"], engine.stats["cancelled"]

    def cancelled_streams() -> float:
        return sum(v for k, v in metrics.streams.values.items() if ("reason", "cancelled") in k)

    seen_before = cancelled_streams()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/audio/speech", json=body(LONG_TEXT, "ryan", 1, 2000)) as first:
            pieces = first.iter_bytes()
            next(pieces)
            with pytest.raises(httpx.ReadTimeout):  # gives up while waiting for the slot
                httpx.post(f"{server.url}/v1/audio/speech", json=body("Waiting.", "aiden", 2, 4), timeout=0.5)
            wait_until(lambda: cancelled_streams() == seen_before + 1, what="the server to notice")
            assert engine.load()["active"] == 1  # the first stream goes on
    wait_until(lambda: idle(engine), what="an idle engine")
    assert engine.stats["streams_done"] == done_before + 1  # only the first one ever ran
    assert engine.stats["cancelled"] == cancelled_before + 1
    assert cancelled_streams() == seen_before + 2
