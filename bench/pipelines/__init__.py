"""The two pipelines a `bench.worker` session drives, each in a process of its own: `ours` (our engine on a
converted model folder) and `official` (the official `qwen-tts` pipeline on the same weights)."""
