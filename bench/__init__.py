"""Benchmark harness: `python -m bench [--quick]` (see docs/benchmarks.md for the results).

Random-weight checkpoints at the real 0.6B/1.7B shapes are built and converted once (cached under
bench/cache/); each measurement runs in its own process (`bench.worker`): our engine per talker
quant and thread count, concurrent streams, the official PyTorch pipeline on the same weights,
the HTTP server when it exists, and this machine's physical limits (memory bandwidth, GEMM/conv
throughput) next to each stage's bytes and FLOPs per frame. `bench.report` turns the results
into docs/benchmarks.md.
"""
