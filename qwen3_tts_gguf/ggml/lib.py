"""ctypes over the ggml that llama-cpp-python installs (`llama_cpp/lib/libggml*.so`): the same library,
backends and devices as the talker, so one process holds one ggml (the way llama-cpp-python binds
llama.cpp itself).

Only what the project's graphs use is declared. Every op is a plain C call that returns a tensor
pointer; ggml asserts (and so aborts the process) on shapes it cannot take, so the graph builders
check their shapes first (`graph.py`) and tests hold every graph they build.
"""

from __future__ import annotations

import ctypes
from functools import cache

from qwen3_tts_gguf.host.devices import llama_library_dir

GGML_MAX_DIMS = 4
TYPE_F32, TYPE_F16, TYPE_I32 = 0, 1, 26
TYPE_NAMES = {TYPE_F32: "f32", TYPE_F16: "f16", 8: "q8_0", TYPE_I32: "i32"}
SORT_DESC = 1
PREC_F32 = 10  # ggml_mul_mat_set_prec: accumulate in f32 (ggml-vulkan's default on fp16 devices is f16)
STATUS_SUCCESS = 0
DEV_CPU = 0  # enum ggml_backend_dev_type


GGML_MAX_SRC, GGML_MAX_OP_PARAMS = 10, 64


class Tensor(ctypes.Structure):
    """The leading fields of `struct ggml_tensor` (ggml.h) up to its data pointer."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * GGML_MAX_DIMS), ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * GGML_MAX_SRC),
                ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p)]


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


T = ctypes.POINTER(Tensor)
_vp, _sz, _i, _i64, _f, _b = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64, ctypes.c_float,
                              ctypes.c_bool)

# name: (argument types after the context, result); ops take the context first and return a tensor
_OPS = {
    "ggml_new_tensor": [_i, _i, ctypes.POINTER(_i64)],
    "ggml_concat": [T, T, _i], "ggml_view_1d": [T, _i64, _sz], "ggml_view_2d": [T, _i64, _i64, _sz, _sz],
    "ggml_view_3d": [T, _i64, _i64, _i64, _sz, _sz, _sz],
    "ggml_view_4d": [T, _i64, _i64, _i64, _i64, _sz, _sz, _sz, _sz],
    "ggml_permute": [T, _i, _i, _i, _i], "ggml_transpose": [T], "ggml_cont": [T],
    "ggml_reshape_1d": [T, _i64], "ggml_reshape_2d": [T, _i64, _i64], "ggml_reshape_3d": [T, _i64, _i64, _i64],
    "ggml_reshape_4d": [T, _i64, _i64, _i64, _i64],
    "ggml_mul_mat": [T, T], "ggml_add": [T, T], "ggml_sub": [T, T], "ggml_mul": [T, T], "ggml_div": [T, T],
    "ggml_scale": [T, _f], "ggml_scale_bias": [T, _f, _f], "ggml_clamp": [T, _f, _f],
    "ggml_sin": [T], "ggml_sqr": [T], "ggml_silu": [T], "ggml_gelu_erf": [T], "ggml_step": [T], "ggml_log": [T],
    "ggml_rms_norm": [T, _f], "ggml_norm": [T, _f], "ggml_soft_max": [T], "ggml_soft_max_ext": [T, T, _f, _f],
    "ggml_get_rows": [T, T], "ggml_sum_rows": [T], "ggml_cumsum": [T], "ggml_argsort": [T, _i], "ggml_top_k": [T, _i],
    "ggml_pad": [T, _i, _i, _i, _i], "ggml_ssm_conv": [T, T], "ggml_im2col": [T, T, _i, _i, _i, _i, _i, _i, _b, _i],
    "ggml_swiglu_split": [T, T], "ggml_cast": [T, _i], "ggml_argmax": [T],
}
_FUNCS = {
    "ggml_init": ([InitParams], _vp), "ggml_free": ([_vp], None), "ggml_tensor_overhead": ([], _sz),
    "ggml_graph_overhead_custom": ([_sz, _b], _sz), "ggml_new_graph_custom": ([_vp, _sz, _b], _vp),
    "ggml_build_forward_expand": ([_vp, T], None), "ggml_graph_n_nodes": ([_vp], _i),
    "ggml_graph_node": ([_vp, _i], T), "ggml_op_name": ([_i], ctypes.c_char_p),
    "ggml_set_input": ([T], None), "ggml_set_output": ([T], None), "ggml_nbytes": ([T], _sz),
    "ggml_set_name": ([T, ctypes.c_char_p], T), "ggml_mul_mat_set_prec": ([T, _i], None),
    "ggml_gallocr_new": ([_vp], _vp), "ggml_gallocr_free": ([_vp], None),
    "ggml_gallocr_alloc_graph": ([_vp, _vp], _b), "ggml_gallocr_reserve": ([_vp, _vp], _b),
    "ggml_gallocr_get_buffer_size": ([_vp, _i], _sz),
    "ggml_backend_alloc_ctx_tensors": ([_vp, _vp], _vp), "ggml_backend_buffer_free": ([_vp], None),
    "ggml_backend_buffer_get_size": ([_vp], _sz),
    "ggml_backend_get_default_buffer_type": ([_vp], _vp), "ggml_backend_name": ([_vp], ctypes.c_char_p),
    "ggml_backend_free": ([_vp], None), "ggml_backend_graph_compute": ([_vp, _vp], _i),
    "ggml_backend_supports_op": ([_vp, T], _b), "ggml_backend_synchronize": ([_vp], None),
    "ggml_backend_tensor_set": ([T, _vp, _sz, _sz], None), "ggml_backend_tensor_get": ([T, _vp, _sz, _sz], None),
    "ggml_backend_dev_count": ([], _sz), "ggml_backend_dev_get": ([_sz], _vp),
    "ggml_backend_dev_type": ([_vp], _i), "ggml_backend_dev_name": ([_vp], ctypes.c_char_p),
    "ggml_backend_dev_description": ([_vp], ctypes.c_char_p), "ggml_backend_dev_init": ([_vp, ctypes.c_char_p], _vp),
    "ggml_backend_dev_backend_reg": ([_vp], _vp),
    "ggml_backend_reg_get_proc_address": ([_vp, ctypes.c_char_p], _vp),
}


class GgmlLibraryError(RuntimeError):
    """The bundled ggml lacks a function these graphs need (another llama-cpp-python build)."""


def _open(folder, stem: str) -> ctypes.CDLL:
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
        if (folder / name).exists():
            return ctypes.CDLL(str(folder / name))
    raise GgmlLibraryError(f"no {stem} library in {folder}")


@cache
def ggml() -> "_Namespace":
    """The declared functions of llama_cpp's libggml-base and libggml, loaded after llama_cpp (the same
    copies, so the same backend registry). GgmlLibraryError names what is missing."""
    from qwen3_tts_gguf.host.cpus import import_llama

    import_llama()
    folder = llama_library_dir()
    libs = (_open(folder, "ggml-base"), _open(folder, "ggml"))
    ns = _Namespace()
    for fn, args in _OPS.items():
        ns.declare(libs, fn, [_vp, *args], T)
    for fn, (args, res) in _FUNCS.items():
        ns.declare(libs, fn, args, res)
    return ns


class _Namespace:
    """The declared functions as attributes, from whichever library exports each."""

    def declare(self, libs: tuple[ctypes.CDLL, ...], name: str, args: list, res) -> None:
        for lib in libs:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = args, res
                setattr(self, name, fn)
                return
        raise GgmlLibraryError(f"the bundled ggml has no {name} (llama-cpp-python 0.3.36's has)")
