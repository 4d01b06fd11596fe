"""The project's own ggml graphs (the streaming codec, the batched code predictor): ctypes over llama.cpp's ggml."""
