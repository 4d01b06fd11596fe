"""The official `qwen-tts` implementation as ground truth: import stubs, random checkpoints, runners.

Only tests and benchmarks import this package; the runtime never does.
"""
