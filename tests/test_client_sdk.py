"""The client SDK (`qtts_client/`) against a real uvicorn server on loopback, and alone.

The tiny converted CustomVoice model runs with the deterministic engine profile and fixed seeds, so
the SDK's audio can be compared byte for byte: live text through the SDK equals the whole text on
the speech route in the streaming text mode. The bare-environment test runs the SDK in a virtual
environment that has only `websockets` (built once under .cache/, then reused). The resume logic is
checked against a scripted WebSocket server; `test_a_cut_connection_resumes_...` needs the server's
side of resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import wave
from pathlib import Path

import pytest
from websockets.asyncio.server import serve

import qtts_client
from qtts_client import (
    APIError,
    AsyncClient,
    Audio,
    AuthenticationError,
    Client,
    Done,
    NotFoundError,
    Progress,
    Resumed,
    ResumeFailed,
    TransportError,
)
from tests.server_fixtures import server_fixtures

ROOT = Path(__file__).resolve().parent.parent
KEY = "sdk-key"
TEXT = "Hello there, this is a live streaming test of words."
SEED = 5
FRAMES = 12
SAMPLES_PER_FRAME = 1920
VENV = ROOT / ".cache" / f"sdk-venv-py{sys.version_info[0]}{sys.version_info[1]}"


registry, server = server_fixtures(4, api_key=KEY)


@pytest.fixture
def client(server):
    with Client(server.url, api_key=KEY, timeout=20) as c:
        yield c


def deltas(text: str = TEXT) -> list[str]:
    """`text` in pieces of 1 to 4 characters, as an LLM's tokens come."""
    sizes, out, i = [1, 3, 2, 4], [], 0
    while i < len(text):
        n = sizes[len(out) % len(sizes)]
        out.append(text[i:i + n])
        i += n
    return out


def reference_pcm(client: Client, text: str = TEXT, **extra) -> bytes:
    """The whole text on the speech route in the streaming text mode (what live text must equal)."""
    return client.speak(text, "ryan", format="pcm", text_mode="streaming", seed=SEED, max_frames=FRAMES, **extra)


# -- HTTP ----------------------------------------------------------------------------------------


def test_speak_returns_a_playable_wav_and_the_same_samples_as_pcm(server, client):
    wav = qtts_client.speak(TEXT, "ryan", base_url=server.url, api_key=KEY, seed=SEED, max_frames=FRAMES)
    with wave.open(io.BytesIO(wav)) as w:  # a streamed wav: its header says "unknown length"
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (1, 24000, 2)
        samples = w.readframes(w.getnframes())
    frames = len(samples) // 2
    assert 0 < frames <= FRAMES * SAMPLES_PER_FRAME and frames % SAMPLES_PER_FRAME == 0
    pcm = client.speak(TEXT, "ryan", format="pcm", model="tts-1", seed=SEED, max_frames=FRAMES)
    assert pcm == samples
    # a base_url written the OpenAI way (with /v1) works the same
    assert Client(server.api_url, api_key=KEY).speak(TEXT, "ryan", format="pcm", seed=SEED,
                                                     max_frames=FRAMES) == pcm


def test_capabilities(client, registry):
    caps = client.capabilities()
    assert caps.supports("qtts", "live_text") and caps.supports("openai-speech")
    assert caps.protocol("qtts").path == "/v1/ws" and caps.protocol("qtts").subprotocol == "qtts.v1"
    assert not caps.supports("qtts", "teleport")
    assert "wav" in caps.formats and "pcm" in caps.formats
    assert caps.default_model == registry.default.id and caps.models[0].type == "custom_voice"
    assert caps.limits["ws_max_session_chars"] == 4096
    assert caps.normalization_languages
    assert client.capabilities() is caps  # remembered
    assert client.capabilities(refresh=True) == caps


# -- live text -------------------------------------------------------------------------------------


def test_a_stream_of_deltas_yields_the_audio_of_the_whole_text_and_done_with_usage(client, registry):
    reference = reference_pcm(client)
    events = list(client.stream_text(iter(deltas()), voice="ryan", seed=SEED, max_frames=FRAMES))
    assert events and isinstance(events[-1], Done)
    audio = [e for e in events if isinstance(e, Audio)]
    assert all(isinstance(e, (Audio, Progress)) for e in events[:-1])
    assert b"".join(a.data for a in audio) == reference
    assert [a.offset for a in audio] == [sum(len(b) for b in audio[:i]) for i in range(len(audio))]
    done = events[-1]
    text_tokens = len(registry.default.model.prompts.text_ids(TEXT))
    frames = len(reference) // 2 // SAMPLES_PER_FRAME
    assert done.finish_reason in ("max_frames", "eos")
    assert (done.usage.input_tokens, done.usage.output_tokens) == (text_tokens, frames)
    assert done.usage.total_tokens == text_tokens + frames
    assert done.audio_s == pytest.approx(len(reference) / 2 / 24000)


def test_progress_events_from_the_server(client):
    events = list(client.stream_text(iter(deltas()), voice="ryan", seed=SEED, max_frames=FRAMES, progress=True))
    progress = [e for e in events if isinstance(e, Progress)]
    assert len(progress) >= 2 and isinstance(events[-1], Done) and events[-2] == progress[-1]
    assert progress[-1].basis == "final" and {p.basis for p in progress[:-1]} == {"frames_per_token"}
    fed = [p.text_fed_end for p in progress]
    assert fed == sorted(fed) and all(0 <= p.spoken_end_estimate <= p.text_fed_end <= len(TEXT) for p in progress)
    audio_s = sum(len(e.data) for e in events if isinstance(e, Audio)) / 2 / 24000
    assert progress[-1].audio_end_s == pytest.approx(audio_s, abs=1e-3)


def test_step_by_step_on_one_socket_then_asyncio(client, server):
    reference = reference_pcm(client)
    with client.connect() as sock:
        for _ in range(2):  # one socket, two utterances
            utterance = sock.start("ryan", seed=SEED, max_frames=FRAMES)
            assert utterance.started.format == "pcm" and utterance.started.sample_rate == 24000
            for piece in deltas():
                utterance.send_text(piece)
            utterance.finish()
            audio, done = utterance.collect()
            assert audio == reference and done.id == utterance.id and utterance.finished

    async def run() -> tuple[bytes, Done]:
        async with AsyncClient(server.url, api_key=KEY) as aclient:
            async with aclient.stream("ryan", seed=SEED, max_frames=FRAMES) as utterance:
                async def feed() -> None:
                    for piece in deltas():
                        await utterance.send_text(piece)
                        await asyncio.sleep(0)
                    await utterance.finish()

                feeder = asyncio.create_task(feed())
                audio = bytearray()
                async for event in utterance:
                    if isinstance(event, Audio):
                        audio += event.data
                await feeder
                return bytes(audio), utterance.done

    audio, done = asyncio.run(run())
    assert audio == reference and done.finish_reason in ("max_frames", "eos")


def test_leaving_the_block_early_cancels_the_utterance(client, registry):
    with client.stream("ryan", seed=SEED, max_frames=400) as utterance:
        utterance.send_text("Hello there, this sentence never ends and keeps the stream waiting")
        assert isinstance(next(iter(utterance)), Audio)
    assert utterance.done is not None and utterance.done.finish_reason == "cancelled"
    deadline = time.monotonic() + 10
    while registry.default.engine.load()["active"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert registry.default.engine.load()["active"] == 0


# -- errors ------------------------------------------------------------------------------------------


def test_server_errors_surface_as_the_sdk_exception(server, client):
    bad_key = Client(server.url, api_key="wrong")
    with pytest.raises(AuthenticationError) as caught:
        bad_key.speak(TEXT, "ryan")
    assert caught.value.status == 401 and caught.value.code == "invalid_api_key"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(AuthenticationError):  # the capabilities route is keyed too
        bad_key.capabilities()
    with pytest.raises(NotFoundError) as caught:
        client.speak(TEXT, "ryan", model="no-such-model")
    assert (caught.value.status, caught.value.code, caught.value.param) == (404, "model_not_found", "model")
    with pytest.raises(APIError) as caught:
        client.speak(TEXT, "ryan", format="wav", max_frames=0)
    assert (caught.value.status, caught.value.param) == (400, "max_frames")

    # the socket: a refused start, a refused message mid-stream (the utterance goes on), a wrong key
    with pytest.raises(APIError) as caught:
        client.stream("nobody-at-all")
    assert (caught.value.status is None and caught.value.code == "invalid_value"
            and caught.value.event["type"] == "error")
    with client.stream("ryan", seed=SEED, max_frames=2) as utterance:
        utterance.send_text("x" * 4097)  # over ws_max_session_chars: refused, not added
        with pytest.raises(APIError) as caught:
            list(utterance)
        assert caught.value.code == "string_above_max_length" and caught.value.event["id"] == utterance.id
        utterance.send_text("Short.")
        utterance.finish()
        audio, done = utterance.collect()
        assert done.finish_reason in ("max_frames", "eos") and audio
    with Client(server.url, api_key="wrong") as wrong, pytest.raises(AuthenticationError):
        wrong.stream("ryan")
    with Client(server.url, api_key=KEY, key_in_query=True) as query_key:  # ?api_key= works too
        with query_key.stream("ryan", max_frames=1) as utterance:
            utterance.send_text("Hi.")
            utterance.finish()
            assert utterance.collect()[1].finish_reason in ("max_frames", "eos")


def test_an_unreachable_server_is_a_transport_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    with Client(f"http://127.0.0.1:{port}", timeout=5) as c:
        with pytest.raises(TransportError):
            c.speak(TEXT, "ryan")
        with pytest.raises(TransportError):
            c.stream("ryan")


# -- only websockets and the standard library -------------------------------------------------------


def bare_venv() -> Path:
    """A virtual environment with only `websockets` (made once, under a lock: tests run concurrently)."""
    python = VENV / "bin" / "python"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / (VENV.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok = python.exists() and subprocess.run([python, "-c", "import websockets.asyncio.client"],
                                                capture_output=True).returncode == 0
        if not ok:
            subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True, capture_output=True)
            pip = subprocess.run([python, "-m", "pip", "install", "-q", "websockets>=13"], capture_output=True,
                                 timeout=300)
            if pip.returncode != 0:  # no package index here: the same release, copied from this environment
                import websockets
                purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                         check=True, capture_output=True, text=True).stdout.strip()
                shutil.copytree(Path(websockets.__file__).parent, Path(purelib) / "websockets",
                                ignore=shutil.ignore_patterns("__pycache__"))
    return python


BARE_SCRIPT = textwrap.dedent("""
    import json, os, sys, wave, io
    import qtts_client
    third_party = sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
                         - {"qtts_client", "websockets", "__main__", "_distutils_hack"})  # the last: the
    # venv's own setuptools .pth hook, loaded at start-up
    url, key = os.environ["QTTS_BASE_URL"], os.environ["QTTS_API_KEY"]
    wav = qtts_client.speak("Hello there.", "ryan", seed=1, max_frames=2)
    with qtts_client.Client() as client:
        events = list(client.stream_text(["Hel", "lo ", "there."], voice="ryan", seed=1, max_frames=2))
    print(json.dumps({"third_party": third_party, "wav": len(wav), "riff": wav[:4].decode(),
                      "events": [type(e).__name__ for e in events],
                      "audio": sum(len(e.data) for e in events if isinstance(e, qtts_client.Audio)),
                      "sys_path_has_main_venv": any(".venv/" in p for p in sys.path)}))
""")


def test_the_sdk_needs_only_websockets_and_the_standard_library(server, tmp_path):
    python = bare_venv()
    missing = subprocess.run([python, "-c", "import fastapi"], capture_output=True)
    assert missing.returncode != 0  # the environment is really bare
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "QTTS_BASE_URL": server.url,
           "QTTS_API_KEY": KEY, "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([python, "-c", BARE_SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["third_party"] == [] and not result["sys_path_has_main_venv"]
    assert result["riff"] == "RIFF" and result["wav"] > 44
    assert result["events"][-1] == "Done" and result["audio"] > 0


# -- resume ----------------------------------------------------------------------------------------


def _cut(utterance) -> None:
    """Drop the TCP connection under a sync utterance, as a network failure would (no close frame)."""
    ws = utterance._async.socket._ws
    utterance._runner.call(ws.transport.abort)


def test_a_cut_connection_resumes_and_the_joined_audio_equals_an_uninterrupted_run(client):
    """Needs the server side of resume (`resumable`, `ack`, `resume`/`resumed`). The client's side
    alone is checked against a scripted server below."""
    assert client.capabilities().supports("qtts", "resume")
    options = dict(seed=SEED, max_frames=FRAMES, resumable=True)
    with client.stream("ryan", **options) as utterance:
        assert utterance.resume_token
        for piece in deltas():
            utterance.send_text(piece)
        utterance.finish()
        uninterrupted, done = utterance.collect()
    assert uninterrupted == reference_pcm(client)

    pieces = deltas()
    half = len(pieces) // 2
    with client.stream("ryan", **options) as utterance:
        first_token = utterance.resume_token
        for piece in pieces[:half]:
            utterance.send_text(piece)
        received = []
        while not any(isinstance(e, Audio) for e in received):  # some audio came (and was acknowledged)
            received.append(next(utterance))
        cut_at = utterance.audio_bytes
        _cut(utterance)
        for piece in pieces[half:]:  # sent while the connection is down: kept, sent again on resume
            utterance.send_text(piece)
        utterance.finish()
        received += list(utterance)
    resumed = [e for e in received if isinstance(e, Resumed)]
    assert len(resumed) == 1 and resumed[0].audio_bytes >= cut_at  # + what was already on its way
    assert utterance.resume_token and utterance.resume_token != first_token  # rotated
    joined = b"".join(e.data for e in received if isinstance(e, Audio))
    assert joined == uninterrupted
    assert isinstance(received[-1], Done) and received[-1].usage.input_tokens == done.usage.input_tokens


def test_a_cut_after_stop_resumes_and_the_socket_takes_the_next_start(client):
    """The stream ends while the client is away (the server sends its `done` on resume, and may
    answer the `stop` the SDK sent again with `no_active_stream`): nothing of it reaches the next
    utterance on the socket."""
    reference = reference_pcm(client)
    with client.connect() as sock:
        utterance = sock.start("ryan", seed=SEED, max_frames=FRAMES, resumable=True)
        for piece in deltas():
            utterance.send_text(piece)
        utterance.finish()
        first = next(utterance)
        _cut(utterance)
        time.sleep(0.5)  # the server may finish the stream meanwhile (its audio and `done` wait for the resume)
        rest, done = utterance.collect()
        assert first.data + rest == reference and done.finish_reason in ("max_frames", "eos")
        second = sock.start("ryan", seed=SEED, max_frames=FRAMES)
        for piece in deltas():
            second.send_text(piece)
        second.finish()
        assert second.collect()[0] == reference


# -- resume against a scripted server (the client's side alone) -------------------------------------


@contextlib.asynccontextmanager
async def scripted_server(handler):
    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"


async def expect(ws, kind: str) -> dict:
    message = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert message["type"] == kind, message
    return message


def test_resume_sends_the_unseen_text_again_with_its_numbers_and_counts_audio_across_the_cut():
    seen: dict[str, list] = {"first": [], "second": []}
    connections = []

    async def handler(ws):
        connections.append(ws)
        if len(connections) == 1:
            start = await expect(ws, "start")
            seen["first"].append(start)
            await ws.send(json.dumps({"type": "started", "id": "u1", "model": "m", "voice": "ryan",
                                      "sample_rate": 24000, "channels": 1, "format": "pcm", "resume_token": "t1"}))
            seen["first"].append(await expect(ws, "text"))
            seen["first"].append(await expect(ws, "text"))
            await ws.send(b"\x01" * 100)
            await ws.send(b"\x02" * 50)
            seen["first"].append(await expect(ws, "ack"))  # on the first chunk
            ws.transport.abort()  # the network fails
            return
        resume = await expect(ws, "resume")
        seen["second"].append(resume)
        await ws.send(json.dumps({"type": "resumed", "id": "u1", "last_text_seq": 1, "resume_token": "t2"}))
        for _ in range(3):
            message = json.loads(await asyncio.wait_for(ws.recv(), 10))
            seen["second"].append(message)
        await ws.send(json.dumps({"type": "progress", "id": "u1", "audio_end_s": 0.08, "text_fed_end": 9,
                                  "spoken_end_estimate": 6, "basis": "frames", "normalized_text_fed_end": 9}))
        await ws.send(b"\x03" * 30)
        await ws.send(json.dumps({"type": "done", "id": "u1", "finish_reason": "eos",
                                  "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4,
                                            "characters": 13, "audio_seconds": 0.1, "frames": 1}}))
        with contextlib.suppress(Exception):
            await ws.wait_closed()

    async def run() -> list:
        async with scripted_server(handler) as url:
            async with AsyncClient(url) as aclient:
                async with aclient.stream("ryan", progress=True) as utterance:
                    await utterance.send_text("Hello ")
                    await utterance.send_text("wor")
                    events = [await utterance.__anext__(), await utterance.__anext__()]
                    await utterance.send_text("ld.")
                    await utterance.finish()
                    events += [e async for e in utterance]
                    assert utterance.resume_token == "t2"
                    return events

    events = asyncio.run(run())
    start = seen["first"][0]
    assert (start["resumable"], start["progress"], start["voice"], start["format"]) == (True, True, "ryan", "pcm")
    assert [(m["seq"], m["text"]) for m in seen["first"][1:3]] == [(1, "Hello "), (2, "wor")]
    assert seen["first"][3] == {"type": "ack", "audio_bytes": 100}
    assert seen["second"][0] == {"type": "resume", "resume_token": "t1", "audio_bytes": 150}
    assert seen["second"][1:] == [{"type": "text", "text": "wor", "seq": 2}, {"type": "text", "text": "ld.", "seq": 3},
                                  {"type": "stop"}]
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Audio", "Audio", "Resumed", "Progress", "Audio", "Done"]
    assert [e.offset for e in events if isinstance(e, Audio)] == [0, 100, 150]
    assert events[2].last_text_seq == 1 and events[2].audio_bytes == 150
    progress = events[3]
    assert (progress.audio_end_s, progress.text_fed_end, progress.spoken_end_estimate, progress.basis) == (
        0.08, 9, 6, "frames")
    assert progress.raw["normalized_text_fed_end"] == 9
    assert events[-1].usage.characters == 13 and events[-1].usage.frames == 1


def test_a_refused_resume_raises_resume_failed():
    connections = []

    async def handler(ws):
        connections.append(ws)
        if len(connections) == 1:
            await expect(ws, "start")
            await ws.send(json.dumps({"type": "started", "id": "u1", "model": "m", "voice": "ryan",
                                      "sample_rate": 24000, "channels": 1, "format": "pcm", "resume_token": "t1"}))
            await ws.send(b"\x01" * 10)
            await asyncio.sleep(0.05)
            ws.transport.abort()
            return
        await expect(ws, "resume")
        await ws.send(json.dumps({"type": "error", "error": {"message": "Unknown or expired resume token.",
                                                             "type": "invalid_request_error", "param": "resume_token",
                                                             "code": "resume_failed"}}))
        await ws.close(1008, "resume_failed")

    async def run() -> None:
        async with scripted_server(handler) as url:
            async with AsyncClient(url) as aclient:
                async with aclient.stream("ryan") as utterance:
                    assert isinstance(await utterance.__anext__(), Audio)
                    with pytest.raises(ResumeFailed) as caught:
                        await utterance.__anext__()
                    assert caught.value.code == "resume_failed" and caught.value.param == "resume_token"

    asyncio.run(run())


def test_a_stop_sent_again_after_the_stream_ended_does_not_reach_the_next_utterance():
    """The `stop` sent again on resume may meet a stream that already ended: its `no_active_stream`
    answer comes after `done`, and the next `start` on the socket skips it."""
    connections = []
    started = {"type": "started", "id": "u1", "model": "m", "voice": "ryan", "sample_rate": 24000, "channels": 1,
               "format": "pcm"}

    async def handler(ws):
        connections.append(ws)
        if len(connections) == 1:
            await expect(ws, "start")
            await ws.send(json.dumps({**started, "resume_token": "t1"}))
            await expect(ws, "text")
            await expect(ws, "stop")
            await ws.send(b"\x01" * 10)
            await expect(ws, "ack")
            ws.transport.abort()
            return
        await expect(ws, "resume")
        await ws.send(json.dumps({"type": "resumed", "id": "u1", "last_text_seq": 1, "resume_token": "t2"}))
        await ws.send(b"\x02" * 10)
        await ws.send(json.dumps({"type": "done", "id": "u1", "finish_reason": "eos", "usage": {}}))
        await expect(ws, "stop")
        await ws.send(json.dumps({"type": "error", "error": {"message": "'stop' before 'start'", "param": "type",
                                                             "type": "invalid_request_error",
                                                             "code": "no_active_stream"}}))
        await expect(ws, "start")
        await ws.send(json.dumps({**started, "id": "u2"}))
        await expect(ws, "text")
        await expect(ws, "stop")
        await ws.send(json.dumps({"type": "done", "id": "u2", "finish_reason": "eos", "usage": {}}))
        with contextlib.suppress(Exception):
            await ws.wait_closed()

    async def run() -> None:
        async with scripted_server(handler) as url:
            async with AsyncClient(url) as aclient, aclient.connect() as sock:
                first = await sock.start("ryan")
                await first.send_text("Hello.")
                await first.finish()
                audio, done = await first.collect()
                assert audio == b"\x01" * 10 + b"\x02" * 10 and done.id == "u1"
                second = await sock.start("ryan")
                assert second.id == "u2" and not second.resumable
                await second.send_text("Again.")
                await second.finish()
                assert (await second.collect())[1].id == "u2"

    asyncio.run(run())
