"""The bench's own engine session (bench/pipelines/ours.py) on a tiny model: the same objects the benchmarks time."""

from __future__ import annotations

import threading

import pytest

from bench.pipelines.ours import OursSession


def _engine_threads() -> int:
    return sum(t.name == "qwen3-tts-engine" for t in threading.enumerate())


def test_a_session_serving_two_models_runs_and_closes_both(tiny_cv_f32):
    """`second_model` (bench.experiments omp-policy) loads the folder again with an engine of its own that
    has served a request, as a server with two models has; the session's runs use the first engine."""
    before = _engine_threads()
    session = OursSession(str(tiny_cv_f32), threads=2, frames=6, warmup_frames=2, concurrency_frames=4,
                          max_streams=2, second_model=True)
    try:
        assert _engine_threads() == before + 2
        assert session.second.stats["streams_done"] == 1 and session.engine.stats["streams_done"] == 1
        run = session.single(0)
        assert run["frames"] == 6 and run["finish_reason"] == "max_frames"
        assert session.second.stats["streams_done"] == 1
    finally:
        session.summary()
    assert _engine_threads() == before


def test_the_graph_variants_load_and_differ_where_they_say(tiny_cv_f32, tmp_path):
    """bench.experiments graphs: each variant folder passes the manifest's checks and holds the graph it names."""
    import onnx

    from qwen3_tts_gguf.convert.checkpoint import Checkpoint
    from qwen3_tts_gguf.convert.predictor_graph import build_code_predictor, quantize_code_predictor
    from qwen3_tts_gguf.model.manifest import CODEC_FILE, PREDICTOR_CPU_FILE, PREDICTOR_FILE, load_manifest

    from bench.experiments import GRAPH_VARIANTS, graph_variants

    def ops(path, op: str) -> int:
        return sum(n.op_type == op for n in onnx.load(str(path), load_external_data=False).graph.node)

    folders = graph_variants(tiny_cv_f32, tmp_path)
    assert list(folders) == list(GRAPH_VARIANTS.values())
    assert list(graph_variants(tiny_cv_f32, tmp_path / "one", ["gqa"])) == [GRAPH_VARIANTS["gqa"]]
    sin, separate, both, gqa, portable = folders.values()
    for folder in folders.values():
        load_manifest(folder, verify_hashes=True)
    assert ops(sin / CODEC_FILE, "Sin") == ops(both / CODEC_FILE, "Sin") > ops(tiny_cv_f32 / CODEC_FILE, "Sin")
    assert ops(separate / CODEC_FILE, "Sin") == ops(tiny_cv_f32 / CODEC_FILE, "Sin")
    ckpt = Checkpoint.open(load_manifest(tiny_cv_f32).source["path"])
    fused = quantize_code_predictor(build_code_predictor(ckpt), "int8")
    layers, steps = ckpt.config.code_predictor.num_layers, 15
    separate_nbits = ops(separate / PREDICTOR_FILE, "MatMulNBits")
    assert separate_nbits == ops(both / PREDICTOR_FILE, "MatMulNBits")
    assert separate_nbits - sum(n.op_type == "MatMulNBits" for n in fused.graph.node) == 3 * layers * steps
    assert ops(gqa / PREDICTOR_FILE, "GroupQueryAttention") == layers * steps
    assert ops(gqa / PREDICTOR_FILE, "MatMulNBits") == sum(n.op_type == "MatMulNBits" for n in fused.graph.node)
    # a code predictor variant replaces the CPU's fused-attention graph, which the engine would run instead
    assert ops(tiny_cv_f32 / PREDICTOR_CPU_FILE, "Attention") == layers * steps
    assert (sin / PREDICTOR_CPU_FILE).is_file()
    assert not any((f / PREDICTOR_CPU_FILE).exists() for f in (separate, both, gqa, portable))
    assert ops(portable / PREDICTOR_FILE, "Attention") == 0
    for file in (PREDICTOR_FILE, PREDICTOR_FILE + ".data"):  # the folder's own portable graph, as converted
        assert (portable / file).read_bytes() == (tiny_cv_f32 / file).read_bytes()


def test_the_graphs_experiment_takes_only_known_variants(capsys):
    """`bench.experiments graphs --graphs`: a comma list of GRAPH_VARIANTS' keys (all by default); an unknown
    key is a usage error naming the known ones."""
    from bench.experiments import GRAPH_VARIANTS, build_parser

    p = build_parser()
    assert p.parse_args(["graphs"]).graphs == list(GRAPH_VARIANTS)
    assert p.parse_args(["graphs", "--graphs", "portable,gqa"]).graphs == ["portable", "gqa"]
    with pytest.raises(SystemExit):
        p.parse_args(["graphs", "--graphs", "portable,flash"])
    assert "unknown graph variant flash (of sin, separate, both, gqa, portable)" in capsys.readouterr().err


def test_the_llama_builds_experiment_needs_folders_with_llama_cpp(tmp_path):
    """`bench.experiments llama-builds`: without --builds, or with a folder holding no llama_cpp, it stops
    with a message before loading anything."""
    from bench.experiments import build_parser, llama_builds

    p = build_parser()
    with pytest.raises(SystemExit, match="--builds DIR"):
        llama_builds(p.parse_args(["llama-builds"]))
    args = p.parse_args(["llama-builds", "--builds", str(tmp_path)])
    assert args.builds == [str(tmp_path)]
    with pytest.raises(SystemExit, match="holds no llama_cpp"):
        llama_builds(args)


def test_the_bench_caches_are_keyed_on_files_that_exist():
    """The bench's checkpoints and converted folders are cached under digests of the code that builds them."""
    from bench import prepare

    assert len(prepare.checkpoint_digest()) == 10 and len(prepare.converter_digest()) == 10
