"""Benchmark harness: `python -m bench [--quick]` (see docs/benchmarks.md for the results).

Random-weight checkpoints at the real 0.6B/1.7B shapes are built and converted once (cached under
bench/cache/); each measurement runs in its own process (`bench.worker`): our engine per talker
quant and thread count, concurrent streams, the official PyTorch pipeline on the same weights,
the HTTP server when it exists, and this machine's physical limits (memory bandwidth, GEMM/conv
throughput) next to each stage's bytes and FLOPs per frame. `bench.report` turns the results
into docs/benchmarks.md.

Where things are: `cli` parses the command line and runs the measurements in order; `session` is the
orchestrator's side of a worker (`Session`, `one_shot`, the progress bar, the budget), `worker` the
worker's side and `pipelines/` the pipelines it drives (ours, the official one, the peer engines on PyPI);
`prepare` builds the models, `machine` and `physics` describe the machine and its limits; `busy`, `memory`,
`first_audio`, `codec_precision`, `agreement` and `http_ttfa` measure one block each; `report/` writes the page
(its hand-written *Summary* comes from bench/summary.md); `experiments` holds prototypes measured apart
(`python -m bench.experiments`) and `soak/` the server under mixed load (`python -m bench soak`).
"""
