"""Voice profiles on disk: round trip, name rules, atomic writes, concurrent creates, broken files."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from qwen3_tts_gguf.voicebank import store as voices
from qwen3_tts_gguf.voicebank.store import (
    VoiceExistsError,
    VoiceNotFoundError,
    VoiceProfile,
    VoiceProfileError,
    VoiceStore,
    validate_name,
)

H = 64


def make_profile(name: str = "alice", *, mode: str = "icl", seed: int = 0, frames: int = 30) -> VoiceProfile:
    rng = np.random.default_rng(seed)
    return VoiceProfile.create(
        name=name, model_size="1.7b", hidden_size=H, speaker_embedding=rng.standard_normal(H).astype(np.float32),
        mode=mode, language="english", ref_text="Hello there, this is a test." if mode == "icl" else None,
        ref_codes=rng.integers(0, 2048, (frames, 16)) if mode == "icl" else None,
    )


def assert_same(a: VoiceProfile, b: VoiceProfile) -> None:
    assert (a.name, a.mode, a.language, a.ref_text, a.model_size, a.hidden_size, a.created_at) == \
           (b.name, b.mode, b.language, b.ref_text, b.model_size, b.hidden_size, b.created_at)
    assert a.speaker_embedding.dtype == b.speaker_embedding.dtype == np.float32
    assert np.array_equal(a.speaker_embedding, b.speaker_embedding)
    if a.ref_codes is None:
        assert b.ref_codes is None
    else:
        assert b.ref_codes.dtype == np.int64 and np.array_equal(a.ref_codes, b.ref_codes)


def test_round_trip_list_delete(tmp_path):
    store = VoiceStore(tmp_path / "voices")
    assert store.list() == []
    icl, xvec = make_profile("alice"), make_profile("bob.v2", mode="xvector", seed=1)
    store.save(icl)
    store.save(xvec)
    assert store.list() == ["alice", "bob.v2"]
    assert_same(store.get("alice"), icl)
    assert_same(store.get("bob.v2"), xvec)
    raw = json.loads((tmp_path / "voices" / "alice.json").read_text())
    assert raw["format_version"] == 1 and raw["model_family"] == "qwen3-tts-12hz" and raw["model_type"] == "base"
    assert raw["ref_codes"]["dtype"] == "int16" and raw["ref_codes"]["shape"] == [30, 16]
    assert raw["speaker_embedding"]["dtype"] == "float32" and raw["speaker_embedding"]["shape"] == [H]
    with pytest.raises(VoiceExistsError):
        store.save(make_profile("alice", seed=2))
    replacement = make_profile("alice", seed=3)
    store.save(replacement, overwrite=True)
    assert_same(store.get("alice"), replacement)
    store.delete("alice")
    assert store.list() == ["bob.v2"]
    with pytest.raises(VoiceNotFoundError):
        store.get("alice")
    with pytest.raises(VoiceNotFoundError):
        store.delete("alice")
    assert not [p for p in (tmp_path / "voices").iterdir() if p.name.startswith(".")]  # no temp files left


def test_codes_as_plain_lists_are_accepted(tmp_path):
    p = make_profile()
    d = p.to_dict()
    d["ref_codes"] = p.ref_codes.tolist()
    (tmp_path / "alice.json").write_text(json.dumps(d))
    assert_same(VoiceStore(tmp_path).get("alice"), p)


@pytest.mark.parametrize("name", ["../x", "", "a" * 65, "..", ".hidden", "a/b", "a\\b", "a..b", "-x", "x y",
                                  "é", "x\n", None, 5])
def test_bad_names(tmp_path, name):
    store = VoiceStore(tmp_path)
    with pytest.raises(VoiceProfileError):
        validate_name(name)
    with pytest.raises(VoiceProfileError):
        store.get(name)
    with pytest.raises(VoiceProfileError):
        store.delete(name)
    with pytest.raises(VoiceProfileError):
        p = make_profile()
        p.name = name
        store.save(p)
    assert list(tmp_path.iterdir()) == []


def test_good_names():
    for name in ["a", "A9", "voice_1.v2-final", "x" * 64, "9lives"]:
        assert validate_name(name) == name


class _CrashingFile:
    """Writes half of the data, then 'crashes'."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        raise KeyboardInterrupt("simulated crash while writing")


@pytest.mark.parametrize("overwrite", [False, True])
def test_crash_while_writing_leaves_no_partial_file(tmp_path, monkeypatch, overwrite):
    store = VoiceStore(tmp_path)
    old = make_profile("alice", seed=1)
    if overwrite:
        store.save(old)
    real_fdopen = os.fdopen
    monkeypatch.setattr(voices.os, "fdopen", lambda fd, mode: _CrashingFile(real_fdopen(fd, mode)))
    with pytest.raises(KeyboardInterrupt):
        store.save(make_profile("alice", seed=2), overwrite=overwrite)
    monkeypatch.undo()
    if overwrite:
        assert_same(store.get("alice"), old)  # the old complete file, untouched
    else:
        assert not (tmp_path / "alice.json").exists()
        with pytest.raises(VoiceNotFoundError):
            store.get("alice")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_crash_after_write_before_rename(tmp_path, monkeypatch):
    """A writer killed between writing its temp file and renaming it leaves only a hidden temp file,
    which list() ignores and a later save removes once stale."""
    store = VoiceStore(tmp_path)

    def die(*args, **kwargs):
        raise SystemExit("killed")

    monkeypatch.setattr(voices.os, "link", die)
    monkeypatch.setattr(voices.os, "unlink", lambda p: None)  # the dead process cleans nothing up
    with pytest.raises(SystemExit):
        store.save(make_profile("alice"))
    monkeypatch.undo()
    temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(temps) == 1 and not (tmp_path / "alice.json").exists() and store.list() == []
    os.utime(temps[0], (0, 0))  # make it old
    store.save(make_profile("bob"))
    assert not temps[0].exists() and store.list() == ["bob"]


@pytest.mark.parametrize("hard_links", [True, False])
def test_concurrent_create_of_one_name(tmp_path, monkeypatch, hard_links):
    if not hard_links:
        def no_link(src, dst):
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(voices.os, "link", no_link)
    store = VoiceStore(tmp_path)
    n = 12
    barrier = threading.Barrier(n)
    results: dict[int, object] = {}
    profiles = [make_profile("shared", seed=i) for i in range(n)]

    def worker(i: int) -> None:
        barrier.wait()
        try:
            store.save(profiles[i])
            results[i] = "ok"
        except VoiceExistsError as e:
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in results.items() if r == "ok"]
    assert len(results) == n and len(winners) == 1
    assert_same(store.get("shared"), profiles[winners[0]])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.json"]


def test_concurrent_overwrites_leave_one_valid_file(tmp_path):
    store = VoiceStore(tmp_path)
    n = 12
    barrier = threading.Barrier(n)
    profiles = [make_profile("shared", seed=i) for i in range(n)]
    errors = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            for _ in range(5):
                store.save(profiles[i], overwrite=True)
                store.get("shared")  # always a complete, valid file
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    final = store.get("shared")
    assert any(np.array_equal(final.speaker_embedding, p.speaker_embedding) for p in profiles)


def _write(tmp_path, name: str, content: str | dict) -> None:
    (tmp_path / f"{name}.json").write_text(content if isinstance(content, str) else json.dumps(content))


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "{" + json.dumps(d)[1:200], "not valid JSON"),
    (lambda d: "[1, 2, 3]", "not a JSON object"),
    (lambda d: {**d, "model_family": "kokoro"}, "model family 'kokoro'"),
    (lambda d: {**d, "model_type": "custom_voice"}, "need a Base model"),
    (lambda d: {**d, "format_version": 99}, "format_version 99"),
    (lambda d: {**d, "name": "bob"}, "holds voice 'bob'"),
    (lambda d: {**d, "mode": "magic"}, "mode 'magic'"),
    (lambda d: {**d, "hidden_size": 32}, r"shape \[64\], expected \[32\]"),
    (lambda d: {**d, "ref_text": ""}, "no reference text"),
    (lambda d: {**d, "ref_codes": None}, "no reference codes"),
    (lambda d: {**d, "ref_codes": [[5000] * 16]}, "integers in 0..2047"),
    (lambda d: {**d, "ref_codes": [[1] * 15]}, r"expected \[T >= 1, 16\]"),
    (lambda d: {**d, "speaker_embedding": {**d["speaker_embedding"], "data": "!!!"}}, "not valid base64"),
    (lambda d: {**d, "speaker_embedding": {**d["speaker_embedding"], "shape": [65]}}, "needs"),
    (lambda d: {k: v for k, v in d.items() if k != "speaker_embedding"}, "lacks speaker_embedding"),
    (lambda d: {**d, "extra": 1}, "unknown fields extra"),
])
def test_broken_profiles_give_clear_errors(tmp_path, mutate, message):
    _write(tmp_path, "alice", mutate(make_profile("alice").to_dict()))
    with pytest.raises(VoiceProfileError, match=message):
        VoiceStore(tmp_path).get("alice")


def test_binary_garbage_and_huge_files(tmp_path):
    (tmp_path / "alice.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(VoiceProfileError, match="UTF-8"):
        VoiceStore(tmp_path).get("alice")
    (tmp_path / "big.json").write_bytes(b" " * (voices.MAX_FILE_BYTES + 1))
    with pytest.raises(VoiceProfileError, match="larger than"):
        VoiceStore(tmp_path).get("big")


def test_profile_validation_and_model_check():
    with pytest.raises(VoiceProfileError, match="no reference text"):
        VoiceProfile.create(name="a", model_size="0.6b", hidden_size=H, speaker_embedding=np.zeros(H), mode="icl",
                            ref_codes=np.zeros((3, 16), np.int64))
    with pytest.raises(VoiceProfileError, match="NaN"):
        VoiceProfile.create(name="a", model_size="0.6b", hidden_size=H, speaker_embedding=np.full(H, np.nan))
    p = make_profile()
    p.check_model("base", "1.7b", H)
    with pytest.raises(VoiceProfileError, match="made with the 1.7b Base model"):
        p.check_model("base", "0.6b", 1024)
    with pytest.raises(VoiceProfileError, match="needs a Base model"):
        p.check_model("custom_voice", "1.7b", H)


def test_default_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("QTTS_VOICES_DIR", str(tmp_path / "v"))
    store = VoiceStore()
    store.save(make_profile("zed", mode="xvector"))
    assert (tmp_path / "v" / "zed.json").is_file() and store.list() == ["zed"]


def test_a_folder_that_is_a_file_holds_no_voice(tmp_path):
    blocker = tmp_path / "voices"
    blocker.write_text("not a folder")
    store = VoiceStore(blocker)
    with pytest.raises(NotADirectoryError, match="is not a folder"):
        store.check()
    assert store.list() == []
    with pytest.raises(VoiceNotFoundError):
        store.get("alloy")
    VoiceStore(tmp_path / "not-yet").check()  # a folder the first saved voice will make
