"""The codec on OpenVINO (`--codec-runtime openvino`): the same graph file, another runtime.

Not bit-exact (its kernels sum in other orders), so it is held to agreement, not to the fp32 bar of
test_codec_graph.py: every chunking within OV_TOL of the official whole-utterance decoder and an SNR of
at least OV_MIN_SNR_DB against it. Then: concurrent calls (the engine's codec lanes) give what calls
one after the other give, the engine speaks through it with the same codes as with ONNX Runtime, and
the settings it cannot honour are refused at start."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import threading

import numpy as np
import pytest

from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.codec_graph import build_codec_decoder
from qwen3_tts_gguf.convert.onnx_builder import save_model
from qwen3_tts_gguf.model.codec import MAX_CALL_FRAMES, CodecDecoder
from qwen3_tts_gguf.model.openvino_session import CodecRuntimeError, check_codec_runtime

from bench.codec_precision import snr_db
from tests.test_codec_graph import official_decoder, official_wav, stream
from tests.test_devices import run_cli

OV_TOL = 1e-3  # measured up to 1.6e-4 against ONNX Runtime on the 0.6B codec (random weights)
OV_MIN_SNR_DB = 60.0  # measured about 80 dB there
T = 24


@pytest.fixture(scope="module", params=["tiny_cv", "tiny0b6_cv_bf16"])
def setup(request, tmp_path_factory):
    ckpt_dir = request.getfixturevalue(request.param)
    path = tmp_path_factory.mktemp("codec") / "codec.onnx"
    save_model(build_codec_decoder(Checkpoint.open(ckpt_dir)), path)
    codes = np.random.default_rng(99).integers(0, 2048, (T, 16))
    return dict(path=path, codes=codes, ref=official_wav(official_decoder(ckpt_dir), codes))


@pytest.mark.parametrize("schedule", [[T], [1], [3], [1, 2, 4, 8]], ids=["whole", "chunk1", "chunk3", "ramp"])
def test_every_chunking_agrees_with_the_official_decoder(setup, schedule):
    dec = CodecDecoder(setup["path"], threads=2, runtime="openvino", max_call_frames=64)
    wav = stream(dec, setup["codes"], schedule)
    assert wav.shape == setup["ref"].shape
    assert np.abs(wav - setup["ref"]).max() < OV_TOL
    assert snr_db(wav, setup["ref"]) > OV_MIN_SNR_DB
    assert dec.runtime == "openvino" and dec.num_quantizers == 16 and dec.samples_per_frame == 1920


def test_concurrent_lanes_give_what_sequential_calls_give(setup):
    """Two streams decoded at once from two threads (two OpenVINO streams, a request per thread) ==
    each decoded alone."""
    dec = CodecDecoder(setup["path"], threads=1, runtime="openvino", lanes=2)
    rng = np.random.default_rng(3)
    utterances = [rng.integers(0, 2048, (12, 16)) for _ in range(2)]
    alone = [stream(dec, codes, [1, 2, 4]) for codes in utterances]
    together: list = [None, None]

    def run(k):
        together[k] = stream(dec, utterances[k], [1, 2, 4])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(alone, together):
        assert b is not None and np.abs(a - b).max() < 1e-6


def speak(model_dir, runtime: str, texts: list[str], frames: int,
          lanes: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """(codes, audio) of each text, all submitted at once to an engine on 2 threads whose codec runs on
    `runtime` (in two lanes of one thread each: `--codec-threads 1`, or one lane), read side by side
    (seeds 5, 6, ...)."""
    from qwen3_tts_gguf.engine.request import SynthesisRequest
    from qwen3_tts_gguf.engine.scheduler import Engine
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.prompt import VoiceSpec
    from qwen3_tts_gguf.model.settings import EngineSettings

    model = LoadedModel(model_dir, EngineSettings(threads=2, max_streams=2, codec_runtime=runtime,
                                                  codec_threads=1 if lanes > 1 else 0))
    try:
        assert model.codec.runtime == runtime and model.stage_threads.codec_lanes == lanes
        with Engine(model) as engine:
            streams = [engine.submit(SynthesisRequest(text, VoiceSpec(speaker="vivian"), max_frames=frames,
                                                      ignore_eos=True, seed=5 + k)) for k, text in enumerate(texts)]
            got: list = [None] * len(streams)

            def read(k):
                audio = np.concatenate([c.samples for c in streams[k]])
                got[k] = (streams[k].result.codes, audio)

            readers = [threading.Thread(target=read, args=(k,)) for k in range(len(streams))]
            for r in readers:
                r.start()
            for r in readers:
                r.join()
        return got
    finally:
        model.close()


def test_the_engine_speaks_through_it_with_the_same_codes(tiny_cv_f32):
    """The codes do not depend on the codec; the audio agrees with ONNX Runtime's codec."""
    [(codes_ort, wav_ort)] = speak(tiny_cv_f32, "onnxruntime", ["Hello there, how are you?"], 20)
    [(codes_ov, wav_ov)] = speak(tiny_cv_f32, "openvino", ["Hello there, how are you?"], 20)
    assert np.array_equal(codes_ort, codes_ov) and len(codes_ov) == 20
    assert wav_ov.shape == wav_ort.shape and np.abs(wav_ov - wav_ort).max() < OV_TOL


def test_settings_it_cannot_honour_are_refused(monkeypatch):
    assert check_codec_runtime("onnxruntime") == ""
    assert check_codec_runtime("openvino").startswith("codec on OpenVINO ")
    with pytest.raises(CodecRuntimeError, match="--device cuda"):
        check_codec_runtime("openvino", device="cuda")
    with pytest.raises(CodecRuntimeError, match="parity profile"):
        check_codec_runtime("openvino", deterministic=True)
    with pytest.raises(CodecRuntimeError, match="expected one of"):
        check_codec_runtime("tensorrt")
    monkeypatch.setattr("qwen3_tts_gguf.model.openvino_session.openvino_installed", lambda: False)
    with pytest.raises(CodecRuntimeError, match="pip install openvino"):
        check_codec_runtime("openvino")


def test_serve_refuses_it_with_deterministic_and_synth_names_it(tiny_cv_f32, tmp_path):
    proc = run_cli("serve", "--model", str(tmp_path / "never-loaded"), "--codec-runtime", "openvino",
                   "--deterministic")
    assert proc.returncode == 2 and "keeps ONNX Runtime's codec" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("serve", "--model", str(tmp_path / "never-loaded"), "--deterministic",
                   QTTS_CODEC_RUNTIME="openvino")
    assert proc.returncode == 2 and "keeps ONNX Runtime's codec" in proc.stderr, proc.stderr
    out = tmp_path / "a.wav"
    proc = run_cli("synth", "Hello.", "--model", str(tiny_cv_f32), "--codec-runtime", "openvino",
                   "--max-frames", "6", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "code predictor on CPUExecutionProvider; codec on OpenVINO" in proc.stderr and out.stat().st_size > 44


def test_the_flag_reaches_the_engine_settings_from_serve_and_synth(monkeypatch):
    from qwen3_tts_gguf.cli import build_parser

    from api.config import engine_settings_from_args

    serve = build_parser().parse_args(["serve", "--codec-runtime", "openvino"])
    assert engine_settings_from_args(serve, check_devices=False).codec_runtime == "openvino"
    default = build_parser().parse_args(["serve"])
    assert engine_settings_from_args(default, check_devices=False).codec_runtime == "auto"
    assert build_parser().parse_args(["synth", "hi", "--codec-runtime", "openvino"]).codec_runtime == "openvino"
    monkeypatch.setenv("QTTS_CODEC_RUNTIME", "openvino")
    assert (engine_settings_from_args(build_parser().parse_args(["serve"]), check_devices=False).codec_runtime
            == "openvino")


def test_two_streams_in_two_lanes_speak_as_they_do_on_onnx_runtime(tiny_cv_f32):
    """Codec calls of one thread in two lanes (`--codec-threads 1`: two OpenVINO streams), two requests
    at once: each stream's audio agrees with the same request's on ONNX Runtime."""
    texts = ["One stream here.", "And another one there."]
    on_ort = speak(tiny_cv_f32, "onnxruntime", texts, 16, lanes=2)
    on_ov = speak(tiny_cv_f32, "openvino", texts, 16, lanes=2)
    for (_, ort_wav), (_, ov_wav) in zip(on_ort, on_ov):
        assert ov_wav.shape == ort_wav.shape == (16 * 1920,)
        assert np.abs(ov_wav - ort_wav).max() < OV_TOL


def test_an_engine_built_without_the_start_up_check_refuses_too(tiny_cv_f32):
    """LoadedModel itself refuses what `check_device_settings` refuses at start, before loading."""
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.settings import EngineSettings

    with pytest.raises(CodecRuntimeError, match="parity profile"):
        LoadedModel(tiny_cv_f32, EngineSettings(threads=2, max_streams=1, deterministic=True, codec_runtime="openvino"))
    with pytest.raises(CodecRuntimeError, match="expected one of"):
        LoadedModel(tiny_cv_f32, EngineSettings(threads=2, max_streams=1, codec_runtime="openvno"))


def test_the_codec_on_openvino_loads_before_the_talker(tiny_cv_f32, monkeypatch):
    """Its import maps the whole cached blob for a moment (openvino_session.py): first, while the
    process holds little else. ONNX Runtime's codec keeps the engine's order (after the talker)."""
    from qwen3_tts_gguf.model import talker as talker_module
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.settings import EngineSettings

    order = []
    real_talker = talker_module.Talker
    monkeypatch.setattr(talker_module, "Talker", lambda *a, **k: order.append("talker") or real_talker(*a, **k))
    import qwen3_tts_gguf.model.codec as codec_module

    real_codec = codec_module.CodecDecoder
    monkeypatch.setattr(codec_module, "CodecDecoder", lambda *a, **k: order.append("codec") or real_codec(*a, **k))
    for runtime, expected in (("openvino", ["codec", "talker"]), ("onnxruntime", ["talker", "codec"])):
        order.clear()
        LoadedModel(tiny_cv_f32, EngineSettings(threads=2, max_streams=1, codec_runtime=runtime)).close()
        assert order == expected, runtime


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_corrupt_codec_graph_is_a_model_folder_error(tiny_cv_f32, tmp_path, runtime):
    from qwen3_tts_gguf.model.loaded import LoadedModel
    from qwen3_tts_gguf.model.manifest import CODEC_FILE, ModelFolderError
    from qwen3_tts_gguf.model.settings import EngineSettings

    folder = tmp_path / "model"
    shutil.copytree(tiny_cv_f32, folder, ignore=shutil.ignore_patterns(".openvino"))
    graph = folder / CODEC_FILE
    graph.write_bytes(b"\xff" * graph.stat().st_size)  # the size the manifest expects, not a graph
    with pytest.raises(ModelFolderError, match="cannot load the ONNX graphs"):
        LoadedModel(folder, EngineSettings(threads=2, max_streams=1, codec_runtime=runtime))


def _blob_resident(cache) -> tuple[int, int]:
    """(resident KiB, size KiB) of this process's mappings of the blobs in `cache` (/proc/self/smaps)."""
    rss = size = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                inside = len(head) == 6 and head[5].startswith(str(cache.resolve()))
            elif inside and head[0] == "Rss:":
                rss += int(head[1])
            elif inside and head[0] == "Size:":
                size += int(head[1])
    return rss, size


def test_the_model_cache_is_filled_once_and_its_weights_are_given_back(setup, tmp_path, monkeypatch):
    """The first session fills OpenVINO's cache beside the graph in a child process (a blob and the
    graph's metadata); the next imports the blob with no child, decodes the same samples, and keeps
    few of the blob's mapped pages once each new shape has been called."""
    from qwen3_tts_gguf.model import openvino_session
    from qwen3_tts_gguf.model.openvino_session import CACHE_FOLDER, OpenVINOSession

    real_page_out = openvino_session._page_out
    graph = tmp_path / "codec_decoder.onnx"
    graph.write_bytes(setup["path"].read_bytes())
    first = CodecDecoder(graph, threads=2, runtime="openvino")
    cache = tmp_path / CACHE_FOLDER
    blobs, stamps = list(cache.glob("*.blob")), list(cache.glob("*.json"))
    assert len(blobs) == 1 and len(stamps) == 1 and not list(cache.glob(".fill-*"))
    wav_first = stream(first, setup["codes"], [1, 2, 4, 8, 9])
    metadata = first.session.metadata
    del first  # its mapping of the blob would share the pages (they are given back only when mapped once)
    gc.collect()

    def no_child(*args, **kwargs):
        raise AssertionError("the cache was filled already")

    monkeypatch.setattr(openvino_session.subprocess, "run", no_child)
    page_outs = []
    monkeypatch.setattr(openvino_session, "_page_out", lambda part: page_outs.append(part) or real_page_out(part))
    again = CodecDecoder(graph, threads=2, runtime="openvino")
    assert again.session.metadata == metadata and again.num_quantizers == 16
    assert again.session.metadata["states"] == json.loads(stamps[0].read_text())["metadata"]["states"]
    wav = stream(again, setup["codes"], [1, 2, 4, 8, 9])
    wav_repeat = stream(again, setup["codes"], [1, 2, 4, 8, 9])
    assert np.abs(wav - wav_first).max() < 1e-6 and np.abs(wav - setup["ref"]).max() < OV_TOL
    assert np.array_equal(wav, wav_repeat) and list(cache.glob("*.blob")) == blobs
    # given back after loading and after the first call of each shape (calls of 1, 2 and 4 frames: the
    # codec splits longer chunks at MAX_CALL_FRAMES), not after repeats
    assert MAX_CALL_FRAMES == 4 and page_outs == [str(cache.resolve())] * 4
    # (pages the other core faulted in a moment ago may wait in its batch: given back at a later call)
    openvino_session._page_out(str(cache.resolve()))
    resident, size = _blob_resident(cache)
    assert size > 0 and resident < size / 2, (resident, size)
    assert isinstance(again.session, OpenVINOSession)


def test_another_openvino_or_another_file_leaves_no_stale_blob(setup, tmp_path):
    """A fill drops the stamps and blobs of another OpenVINO version, of an earlier version of the file,
    and stamps it cannot read; the cache then holds exactly what its stamps name."""
    from qwen3_tts_gguf.model.openvino_session import CACHE_FOLDER

    graph = tmp_path / "codec_decoder.onnx"
    graph.write_bytes(setup["path"].read_bytes())
    CodecDecoder(graph, threads=2, runtime="openvino")
    cache = tmp_path / CACHE_FOLDER
    [first] = cache.glob("*.json")
    (cache / "old.blob").write_bytes(b"an older OpenVINO's blob")
    (cache / "old.json").write_text(json.dumps({"openvino": "2020.1", "graph": [], "blobs": ["old.blob"],
                                                "metadata": {}}))
    (cache / "junk.json").write_text("{ not json")
    later = graph.stat().st_mtime_ns + 10**9
    os.utime(graph, ns=(later, later))  # the file converted again
    dec = CodecDecoder(graph, threads=2, runtime="openvino")
    [stamp] = cache.glob("*.json")
    assert stamp != first and not (cache / "old.blob").exists()
    named = json.loads(stamp.read_text())["blobs"]
    assert named and sorted(p.name for p in cache.glob("*.blob")) == sorted(named)
    assert np.abs(stream(dec, setup["codes"], [T]) - setup["ref"]).max() < OV_TOL


def test_without_a_cache_it_compiles_from_the_file(setup, tmp_path, monkeypatch, caplog):
    """A model folder where the cache cannot be made (here `.openvino` is a file), or a child that
    fails: the session compiles from the graph file, with a warning, and decodes the same."""
    from qwen3_tts_gguf.model import openvino_session
    from qwen3_tts_gguf.model.openvino_session import CACHE_FOLDER

    graph = tmp_path / "blocked" / "codec_decoder.onnx"
    graph.parent.mkdir()
    graph.write_bytes(setup["path"].read_bytes())
    (graph.parent / CACHE_FOLDER).write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="qwen3_tts_gguf.model.openvino_session"):
        dec = CodecDecoder(graph, threads=2, runtime="openvino")
    assert "cannot hold OpenVINO's cache" in caplog.text and dec.num_quantizers == 16
    wav = stream(dec, setup["codes"], [T])
    assert np.abs(wav - setup["ref"]).max() < OV_TOL

    graph = tmp_path / "failing" / "codec_decoder.onnx"
    graph.parent.mkdir()
    graph.write_bytes(setup["path"].read_bytes())
    monkeypatch.setattr(openvino_session.sys, "executable", "/bin/false")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qwen3_tts_gguf.model.openvino_session"):
        dec = CodecDecoder(graph, threads=2, runtime="openvino")
    assert "could not be filled" in caplog.text
    cache = graph.parent / CACHE_FOLDER
    assert not list(cache.glob("*.json")) and not list(cache.glob("*.blob")) and not list(cache.glob(".fill-*"))
    assert np.abs(stream(dec, setup["codes"], [T]) - setup["ref"]).max() < OV_TOL
