"""Graphs of our own on ggml: a backend on one device, weights uploaded to it once, and graphs built
once per shape, then computed again with new inputs.

Shapes are written as numpy shapes everywhere in this package (ggml's `ne` is a numpy shape
reversed): a numpy array [B, C, L] is a ggml tensor of ne [L, C, B], so arrays go in and out of the
device as they are, without transposes.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

import numpy as np

from qwen3_tts_gguf.ggml.lib import DEV_CPU, PREC_F32, STATUS_SUCCESS, TYPE_F16, TYPE_F32, TYPE_I32, InitParams, T, ggml

_NUMPY_TYPES = {TYPE_F32: np.float32, TYPE_F16: np.float16, TYPE_I32: np.int32}
_TYPE_OF = {np.dtype(v): k for k, v in _NUMPY_TYPES.items()}


class GgmlError(RuntimeError):
    """A ggml device, buffer or graph that could not be made or run."""


ROW_MULTIPLE = 4
"""Rows of every matrix product are padded to a multiple of this (`Ops.product`)."""
VECTOR_KERNEL_ROWS = 8
"""ggml-vulkan multiplies up to this many rows with its matrix-vector kernels, in f32; more rows go to its
matrix kernels, which round their inputs to f16 on a device that reports fp16 (most GPUs, lavapipe), whatever
the tensors' types."""


def dims(t: T) -> tuple[int, ...]:
    """A tensor's four axes in numpy order (its ne reversed)."""
    return tuple(reversed(list(t.contents.ne)))


def shape_of(t: T) -> tuple[int, ...]:
    """A tensor's numpy shape (its ne reversed, trailing 1s of ne dropped: at least one axis)."""
    ne = list(t.contents.ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(reversed(ne))


class Backend:
    """One ggml backend: `device` names a ggml device ("CPU", "Vulkan0", "CUDA0"; None: the CPU).
    `threads`: the CPU backend's threads. Calls into it are serialised (`lock`)."""

    def __init__(self, device: str | None = None, *, threads: int | None = None):
        g = ggml()
        wanted = device or "CPU"
        found = None
        for i in range(g.ggml_backend_dev_count()):
            d = g.ggml_backend_dev_get(i)
            if g.ggml_backend_dev_name(d).decode().lower() == wanted.lower():
                found = d
                break
        if found is None:
            from qwen3_tts_gguf.host.devices import llama_runtime

            raise GgmlError(f"no ggml device {wanted!r} (this build has: "
                            f"{', '.join(d.name for d in llama_runtime().devices)})")
        self.ptr = g.ggml_backend_dev_init(found, None)
        if not self.ptr:
            raise GgmlError(f"ggml could not start its {wanted} backend")
        self.device = g.ggml_backend_dev_name(found).decode()
        self.is_cpu = g.ggml_backend_dev_type(found) == DEV_CPU
        if self.is_cpu and threads:
            reg = g.ggml_backend_dev_backend_reg(found)
            address = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_set_n_threads")
            if address:
                ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)(address)(self.ptr, int(threads))
        self.buffer_type = g.ggml_backend_get_default_buffer_type(self.ptr)
        self.lock = threading.Lock()

    def close(self) -> None:
        if self.ptr:
            ggml().ggml_backend_free(self.ptr)
            self.ptr = None


class Weights:
    """Named arrays uploaded once to a backend's memory. `types`: a ggml type per name (f32 default;
    f16 for matrices where a caller asks)."""

    def __init__(self, backend: Backend, arrays: Mapping[str, np.ndarray], types: Mapping[str, int] | None = None):
        g = ggml()
        types = types or {}
        self.ctx = g.ggml_init(InitParams(g.ggml_tensor_overhead() * (len(arrays) + 1), None, True))
        self.tensors: dict[str, T] = {}
        staged = {}
        for name, array in arrays.items():
            kind = types.get(name, TYPE_F32 if array.dtype.kind == "f" else _TYPE_OF[np.dtype(array.dtype)])
            data = np.ascontiguousarray(array, _NUMPY_TYPES[kind])
            ne = (ctypes.c_int64 * max(1, data.ndim))(*reversed(data.shape or (1,)))
            t = g.ggml_new_tensor(self.ctx, kind, max(1, data.ndim), ne)
            self.tensors[name] = t
            staged[name] = data
        self.buffer = g.ggml_backend_alloc_ctx_tensors(self.ctx, backend.ptr)
        if not self.buffer:
            g.ggml_free(self.ctx)
            raise GgmlError(f"the {backend.device} device has no room for the weights")
        self.nbytes = int(g.ggml_backend_buffer_get_size(self.buffer))
        for name, data in staged.items():
            g.ggml_backend_tensor_set(self.tensors[name], data.ctypes.data, 0, data.nbytes)

    def __getitem__(self, name: str) -> T:
        return self.tensors[name]

    def close(self) -> None:
        if self.buffer:
            ggml().ggml_backend_buffer_free(self.buffer)
            ggml().ggml_free(self.ctx)
            self.buffer = None


class Ops:
    """Builds one graph: `ops.mul_mat(a, b)` is ggml_mul_mat(ctx, a, b), and so for every op of
    `lib._OPS`; `input` and `output` name the graph's ends."""

    def __init__(self, max_nodes: int = 16384):
        g = ggml()
        self.max_nodes = max_nodes
        size = g.ggml_tensor_overhead() * max_nodes + g.ggml_graph_overhead_custom(max_nodes, False)
        self.ctx = g.ggml_init(InitParams(size, None, True))
        self.inputs: dict[str, tuple[T, tuple[int, ...], np.dtype]] = {}
        self.outputs: dict[str, T] = {}
        self.output_shapes: dict[str, tuple[int, ...]] = {}
        self.made: list[T] = []  # every tensor of the graph's own (not the weights): placed anew at each run

    def __getattr__(self, op: str) -> Callable[..., T]:
        g = ggml()
        fn = getattr(g, "ggml_" + op)
        ctx, made = self.ctx, self.made

        def call(*args) -> T:
            t = fn(ctx, *args)
            made.append(t)
            return t

        def product(*args) -> T:  # every product accumulates in f32, on every backend
            t = call(*args)
            g.ggml_mul_mat_set_prec(t, PREC_F32)
            return t

        return product if op == "mul_mat" else call

    def product(self, weight: T, rows: T, *, rows_first: bool, piece: int = 0) -> T:
        """rows [R, in] times a weight [out, in]: [out, R] (`rows_first`: the rows are ggml's first operand)
        or [R, out]. ggml's CPU backend picks its kernel by the rows' count (its tiled kernel takes multiples
        of 4 only), so rows are padded to ROW_MULTIPLE with zeros: a row's value comes from the same kernel
        whatever the call holds (chunked audio bit for bit, a stream's codes alone = beside others).
        `piece` (rows last only): the rows are multiplied `piece` at a time (on a GPU, VECTOR_KERNEL_ROWS: every
        row then meets the f32 matrix-vector kernels, however many the call holds)."""
        count = rows.contents.ne[1]
        if piece and count > piece:
            if rows_first:
                raise ValueError("a product in pieces takes its rows last")
            nb = rows.contents.nb
            parts = [self.product(weight, self.view_2d(rows, rows.contents.ne[0], min(piece, count - at), nb[1],
                                                       at * nb[1]), rows_first=False)
                     for at in range(0, count, piece)]
            y = parts[0]
            for part in parts[1:]:
                y = self.concat(y, part, 1)
            return y
        pad = -count % ROW_MULTIPLE
        x = self.pad(rows, 0, pad, 0, 0) if pad else rows
        y = self.mul_mat(x, weight) if rows_first else self.mul_mat(weight, x)
        if not pad:
            return y
        ne, nb = y.contents.ne, y.contents.nb
        return self.cont(self.view_2d(y, count, ne[1], nb[1], 0) if rows_first else
                         self.view_2d(y, ne[0], count, nb[1], 0))

    def input(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> T:
        dtype = np.dtype(dtype)
        ne = (ctypes.c_int64 * len(shape))(*reversed(shape))
        t = ggml().ggml_new_tensor(self.ctx, _TYPE_OF[dtype], len(shape), ne)
        self.made.append(t)
        ggml().ggml_set_input(t)
        self.inputs[name] = (t, tuple(shape), dtype)
        return t

    def output(self, name: str, t: T, shape: tuple[int, ...] | None = None) -> None:
        """`t` read back as `name`, a numpy array of `shape` (default: `shape_of(t)`)."""
        ggml().ggml_set_output(t)
        if shape is not None and int(np.prod(shape)) != int(np.prod(shape_of(t))):
            raise ValueError(f"output {name}: {list(shape_of(t))} cannot be read as {list(shape)}")
        self.outputs[name] = t
        self.output_shapes[name] = tuple(shape) if shape is not None else shape_of(t)


class Graph:
    """A built graph: its tensors placed in an allocator's buffer at each run (`GraphCache.run`)."""

    def __init__(self, ops: Ops):
        g = ggml()
        self.ops = ops
        self.cgraph = g.ggml_new_graph_custom(ops.ctx, ops.max_nodes, False)
        for t in ops.outputs.values():
            g.ggml_build_forward_expand(self.cgraph, t)
        self.nodes = g.ggml_graph_n_nodes(self.cgraph)

    def flops(self) -> int:
        """Floating-point operations of one run: its matrix products (2 x rows x columns x depth) and causal
        depthwise convolutions; elementwise work is left out, as in the ONNX graphs' counts (bench/physics.py)."""
        g = ggml()
        total = 0
        for i in range(self.nodes):
            node = g.ggml_graph_node(self.cgraph, i).contents
            op = g.ggml_op_name(node.op).decode()
            if op in ("MUL_MAT", "SSM_CONV"):
                a, b = (ctypes.cast(node.src[k], T).contents for k in (0, 1))
                total += 2 * int(np.prod(list(node.ne))) * (a.ne[0] if op == "MUL_MAT" else b.ne[0])
        return total

    def compute(self, backend: Backend, allocator_ptr, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        g = ggml()
        # ggml_gallocr keeps a tensor that already has an address where it is: this graph's own tensors are
        # placed anew, as other graphs ran in the same buffer since
        for t in self.ops.made:
            t.contents.data = None
            t.contents.buffer = None
        if not g.ggml_gallocr_alloc_graph(allocator_ptr, self.cgraph):
            raise GgmlError(f"the {backend.device} device has no room for a graph's activations")
        for name, (t, shape, dtype) in self.ops.inputs.items():
            data = np.ascontiguousarray(feeds[name], dtype)
            if data.shape != shape:
                raise ValueError(f"input {name}: expected {list(shape)}, got {list(data.shape)}")
            if t.contents.buffer:  # an input no output depends on has no place (and needs none)
                g.ggml_backend_tensor_set(t, data.ctypes.data, 0, data.nbytes)
        status = g.ggml_backend_graph_compute(backend.ptr, self.cgraph)
        if status != STATUS_SUCCESS:
            raise GgmlError(f"ggml's {backend.device} backend failed a graph (status {status})")
        out = {}
        for name, t in self.ops.outputs.items():
            array = np.empty(self.ops.output_shapes[name], _NUMPY_TYPES[t.contents.type])
            g.ggml_backend_tensor_get(t, array.ctypes.data, 0, array.nbytes)
            out[name] = array
        return out

    def close(self) -> None:
        if self.ops.ctx:
            ggml().ggml_free(self.ops.ctx)
            self.ops.ctx = None


class GraphCache:
    """The graphs of one stage, built once per key (`build(key) -> Ops`) and kept (the least recently used
    goes beyond `max_graphs`), all placed in one activation buffer. `reserve` sizes that buffer for the
    largest graphs at load: it then never moves, and should a graph still need a larger one, every other
    graph is built again (ggml-vulkan failed on graphs kept across a move of their buffer)."""

    def __init__(self, backend: Backend, build: Callable[[Hashable], Ops], max_graphs: int):
        self.backend = backend
        self._build = build
        self._max_graphs = max_graphs
        self._graphs: OrderedDict[Hashable, Graph] = OrderedDict()
        self._allocator = ggml().ggml_gallocr_new(backend.buffer_type)
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """The activation buffer's size."""
        return int(ggml().ggml_gallocr_get_buffer_size(self._allocator, 0)) if self._allocator else 0

    def reserve(self, keys) -> None:
        """Size the buffer for the graphs of `keys` (the largest a stage makes)."""
        with self._lock:
            for key in keys:
                if not ggml().ggml_gallocr_reserve(self._allocator, self._graph(key).cgraph):
                    raise GgmlError(f"the {self.backend.device} device has no room for a graph's activations")

    def run(self, key: Hashable, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock, self.backend.lock:
            graph = self._graph(key)
            before = self.nbytes
            out = graph.compute(self.backend, self._allocator, feeds)
            if before and self.nbytes != before:  # the buffer moved: the other graphs are built again
                for other in [k for k in self._graphs if k != key]:
                    self._graphs.pop(other).close()
            return out

    def _graph(self, key: Hashable) -> Graph:
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = Graph(self._build(key))
            while len(self._graphs) > self._max_graphs:
                self._graphs.popitem(last=False)[1].close()
        self._graphs.move_to_end(key)
        return graph

    def close(self) -> None:
        with self._lock:
            for graph in self._graphs.values():
                graph.close()
            self._graphs.clear()
            if self._allocator:
                ggml().ggml_gallocr_free(self._allocator)
                self._allocator = None


class GgmlStage:
    """What a stage on ggml holds: its `weights` and its graphs (`_graphs`, a GraphCache)."""

    weights: Weights
    _graphs: GraphCache

    @property
    def nbytes(self) -> int:
        """Device memory held: weights and the activation buffer."""
        return self.weights.nbytes + self._graphs.nbytes

    def close(self) -> None:
        self._graphs.close()
        self.weights.close()
