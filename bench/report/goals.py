"""The goals of the issue *Real-time CPU* (2-core machine), each rendered next to its figure in *Targets*
and in its block's own section."""

RTF_TARGET = 1.2  # one stream, default configuration
FAST_RTF_TARGET = 1.0  # one stream, the `fast` preset
STALL_FREE_BELOW_RTF = 0.9  # a 30 s text plays without a stall whenever one stream's RTF is below this
TTFA_TARGETS = {"non-streaming/cold": 0.25, "streaming/cold": 0.15, "streaming/cached": 0.10, "live/cold": 0.15}
CONCURRENT_RTF_TARGET = 0.6  # eight streams' aggregate RTF
STAGE_BOUND_TARGET = 1.5  # each stage within this factor of its lower bound
ONE_PROCESS_TARGET = 1.3  # slowdown beside one busy process
MEMORY_TARGET_MB = 1536  # one model for up to 8 streams within 1.5 GB
