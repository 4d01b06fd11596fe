"""The bench's peers block (bench/pipelines/peers.py): its protocol with fake workers, the qwentts.cpp GGUF layout
on a tiny checkpoint, and its section of the report. No peer is installed and nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_bench_first_audio import _Progress

from bench import cli
from bench.pipelines import peers
from bench.pipelines.qwentts_cpp_files import (
    CODEC_RULES,
    TALKER_RULES,
    qwentts_name,
    target_type,
    write_codec,
    write_talker,
)
from bench.report.page import ONLY_RENDERERS, splice_section
from bench.report.peers import render_peers


def _run(frames: int, wall: float, first: float = 0.2, background: float = 0.02) -> dict:
    return {"frames": frames, "requested_frames": frames, "audio_s": frames * 0.08, "wall_s": wall,
            "first_audio_s": first, "background": background, "rtf": wall / (frames * 0.08)}


def test_the_rtf_of_a_round_leaves_out_the_fixed_costs():
    # 1 s fixed + 0.1 s a frame: 0.1 / 0.08 = 1.25 however long the utterance
    assert peers.steady_rtf(_run(2, 1.2), _run(50, 6.0)) == pytest.approx(1.25)
    assert peers.steady_rtf({"error": "gone"}, _run(50, 6.0)) is None
    assert peers.steady_rtf(_run(2, 1.2), _run(2, 1.3)) is None  # no audio between the two


def test_rounds_rotate_so_no_engine_always_runs_first():
    labels = ["a", "b", "c"]
    assert [peers.rotation(labels, r)[0] for r in range(4)] == ["a", "b", "c", "a"]
    assert sorted(peers.rotation(labels, 2)) == labels


def test_measure_runs_every_engine_side_by_side_and_reports_a_peer_that_cannot_install(monkeypatch, tmp_path):
    calls, sessions = [], []

    class FakeSession:
        def __init__(self, progress, label, kind, params, timeout=0, env=None, python=None):
            self.label, self.kind, self.params, self.env, self.python = label, kind, params, env, python
            self.ready, self.closed = {"ready": True}, False
            sessions.append(self)

        @property
        def ok(self):
            return True

        def call(self, op, rep, frames):
            calls.append((self.label, rep, frames))
            return _run(frames, 0.5 + 0.1 * frames)

        def close(self):
            self.closed = True
            return {"peak_rss_mb": 1000.0, "native": "x"}

    def no_pip(peer, log=print):
        if peer.key == "qwentts":
            raise peers.PeerError("`pip install realtimetts-qwen-native-cpu==0.4.2` failed: no network")
        return tmp_path / "python"

    monkeypatch.setattr("bench.session.Session", FakeSession)
    monkeypatch.setattr("bench.prepare.ensure_checkpoint",
                        lambda shape, log=print: (tmp_path / f"ckpt-{shape}-d", "bpe"))
    monkeypatch.setattr("bench.prepare.ensure_converted",
                        lambda ckpt, shape, q, cp, t, log=print: tmp_path / f"{q}-{cp}")
    monkeypatch.setattr(peers, "ensure_venv", no_pip)
    monkeypatch.setattr(peers, "ensure_model", lambda peer, fmt, ckpt, python, log=print: {
        "files": {"tmod": str(tmp_path / fmt / "model.tmod")}, "how": "vox.build", "convert_s": 3.0})
    out = peers.measure_shape(_Progress(), "0.6b", 2, 0.0, rounds=2)["engines"]
    ran = [label for label, e in out.items() if "error" not in e]
    assert ran == ["ours, default", "ours, `--preset fast`", "vox-tts q8", "vox-tts q4"]
    assert "no network" in out["qwentts.cpp Q8_0"]["error"]
    # each round: every engine a short then a long run, the order rotating
    firsts = [calls[i * 2 * len(ran)][0] for i in range(2)]
    assert firsts == ran[:2] and len(calls) == 2 * 2 * len(ran)
    assert {frames for _, _, frames in calls} == {peers.SHORT, peers.LONG}
    assert all(s.closed and s.params["threads"] == 2 for s in sessions)
    vox = [s for s in sessions if s.kind == "peer"]
    assert vox and all(s.env == {"VOX_DEBUG_NO_EOS": "1"} and s.python == str(tmp_path / "python") for s in vox)
    assert out["vox-tts q8"]["runs"][0]["rtf"] == pytest.approx(0.1 / 0.08)
    assert out["vox-tts q8"]["summary"]["peak_rss_mb"] == 1000.0


def test_names_and_quantization_follow_the_qwentts_layout():
    assert (qwentts_name("talker.model.layers.3.self_attn.q_norm.weight", TALKER_RULES)
            == "talker.blk.3.attn_q_norm.weight")
    assert qwentts_name("talker.code_predictor.lm_head.14.weight", TALKER_RULES) == "code_pred.lm_head.14.weight"
    assert qwentts_name("decoder.decoder.2.block.4.conv2.conv.bias", CODEC_RULES) == "tok_dec.dec.2.res.2.conv2.bias"
    assert qwentts_name("decoder.pre_transformer.layers.0.mlp_layer_scale.scale", CODEC_RULES) == \
        "tok_dec.pre_tfm.blk.0.ffn_scale"
    assert qwentts_name("something.else", TALKER_RULES) is None
    assert target_type("talker.blk.0.attn_q.weight", (2048, 1024), "Q8_0") == "Q8_0"
    assert target_type("tok_dec.dec.1.conv_t.weight", (1536, 768, 16), "Q8_0") == "F16"  # kernel rows of 16
    assert target_type("tok_dec.vq_first.0.codebook", (2048, 256), "Q8_0") == "F32"
    assert target_type("talker.output_norm.weight", (1024,), "Q8_0") == "F32"


def test_the_qwentts_files_of_a_tiny_checkpoint(tiny_cv, tmp_path):
    import gguf

    write_talker(tiny_cv, tmp_path / "talker.gguf")
    write_codec(tiny_cv, tmp_path / "codec.gguf")
    talker = gguf.GGUFReader(str(tmp_path / "talker.gguf"))
    vocab = int(talker.fields["qwen3-tts.talker.vocab_size"].parts[-1][0])
    assert int(talker.fields["qwen3-tts.codec.eos_id"].parts[-1][0]) == vocab  # out of the sampler's reach
    names = {t.name: t.tensor_type.name for t in talker.tensors}
    assert names["talker.output_norm.weight"] == "F32" and "Q8_0" in names.values()  # tiny rows: some are F16
    codec = gguf.GGUFReader(str(tmp_path / "codec.gguf"))
    names = {t.name: t.tensor_type.name for t in codec.tensors}
    assert (names["tok_dec.vq_first.0.codebook"] == "F32"
            and names["tok_dec.pre_tfm.input_proj.weight"] in ("Q8_0", "F16"))
    assert not [n for n in names if n.startswith("tok_enc.")]


def test_vox_converts_with_its_own_cli():
    cmd = peers.vox_build_command(Path("/v/bin/python"), Path("/ck"), "q4", Path("/out/model.tmod"))
    assert cmd[1:4] == ["-m", "vox.build", "--model"] and "--quant" in cmd and cmd[cmd.index("--quant") + 1] == "q4"


def _block() -> dict:
    def runs(rtf_wall: float) -> list[dict]:
        return [{"round": r, "short": _run(2, 0.4 + r * 0.01), "long": _run(50, 0.4 + rtf_wall * 48 * 0.08),
                 "rtf": rtf_wall} for r in range(3)]

    engines = {
        "ours, default": {"kind": "ours", "format": "talker q8_0 + code predictor int8", "runs": runs(1.25),
                          "summary": {"peak_rss_mb": 1446.0}, "model": "bench/cache/models/x"},
        "qwentts.cpp Q8_0": {"kind": "peer", "format": "Q8_0", "error": "conversion failed: KeyError: 'x'"},
        "vox-tts q8": {"kind": "peer", "format": "q8", "runs": runs(2.33), "how": "`python -m vox.build`",
                       "model": "bench/cache/peers/v", "convert_s": 16.0,
                       "summary": {"peak_rss_mb": 1206.0, "native": "0.19.5"}},
    }
    return {"date": "2026-12-05 18:45 UTC", "commit": "abc", "dirty_files": 0, "cpu": "Intel(R) Xeon(R) Processor",
            "cores": 2, "flags": ["avx2", "avx512f"], "hypervisor": True, "threads": 2, "short_frames": 2,
            "long_frames": 50, "rounds": 3, "loadavg_start": ["0.10", "0.20", "0.30"],
            "loadavg_end": ["0.4", "0.3", "0.3"],
            "peers": {p.key: {"engine": p.engine, "package": p.package, "version": p.version, "what": p.what,
                              "model_format": p.model_format, "env": p.env} for p in peers.PEERS},
            "shapes": {"0.6b": {"engines": engines}}}


def test_the_section_shows_each_engine_with_its_versions_and_what_failed():
    text = render_peers(_block(), standalone=True)
    assert text.startswith("## Peer engines\n") and "`python -m bench --only peers`" in text
    assert "`realtimetts-qwen-native-cpu==0.4.2`" in text and "`vox-tts==0.19.5`" in text
    assert "`VOX_DEBUG_NO_EOS=1`" in text and "load average 0.10 0.20 0.30" in text
    assert "at its top: on Intel(R) Xeon(R) Processor, 2 cores (virtual machine), flags avx2, avx512f; the" in text
    assert "Model: two GGUF files" in text and "`bench/cache/peers-venv-vox`" in text
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ") and " | " in line}
    assert "| 1.25 (1.25) |" in rows["ours, default"] and "| 1,446 |" in rows["ours, default"]
    assert "| 50 / 2 |" in rows["vox-tts q8"] and "| 2 % |" in rows["vox-tts q8"]
    assert "not measured: conversion failed: KeyError" in rows["qwentts.cpp Q8_0"]


def test_a_peer_that_stopped_early_shows_its_frames():
    block = _block()
    block["shapes"]["0.6b"]["engines"]["vox-tts q8"]["runs"][1]["long"]["frames"] = 41
    row = next(line for line in render_peers(block).splitlines() if line.startswith("| vox-tts q8"))
    assert "| 41–50 of 50 / 2 |" in row


def test_only_peers_replaces_its_section_of_the_page():
    assert cli.ONLY_BLOCKS["peers"] == "## Peer engines" and ONLY_RENDERERS["peers"] is render_peers
    doc = "# Benchmarks\n\n## Stage runtimes\n\nold\n\n## Machine limits (measured in the same run)\n\nx\n"
    out = splice_section(doc, cli.ONLY_BLOCKS["peers"], render_peers(_block(), standalone=True))
    assert out.index("## Stage runtimes") < out.index("## Peer engines") < out.index("## Machine limits")
    again = splice_section(out, cli.ONLY_BLOCKS["peers"], "## Peer engines\n\nnew\n")
    assert again.count("## Peer engines") == 1 and "new" in again and "| vox-tts q8 |" not in again
