"""The pipelines a `bench.worker` session drives, each in a process of its own: `ours` (our engine on a
converted model folder), `official` (the official `qwen-tts` pipeline on the same weights) and `peers` (the peer
engines on PyPI, each in a venv of its own, on models `qwentts_cpp_files` or the peer's converter made of the same
weights)."""
