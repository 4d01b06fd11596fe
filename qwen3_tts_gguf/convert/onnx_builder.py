"""A thin SSA layer over `onnx.helper` for building inference graphs from numpy weights.

Every op call returns the name(s) of its output value(s); constants are cached; weights become
initializers. `float_type` (float32 or float64) sets the precision of every float constant and
weight, so the same builder code yields the fp32 runtime graph and the fp64 graph that
`onnx.reference` uses to prove a construction exact.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
_ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
         np.int32: TensorProto.INT32, np.bool_: TensorProto.BOOL, np.float16: TensorProto.FLOAT16}
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf's 2 GB cap on a single file


def elem_type(dtype) -> int:
    return _ELEM[np.dtype(dtype).type]


class GraphBuilder:
    """Accumulates nodes, initializers, inputs and outputs of one ONNX graph."""

    def __init__(self, name: str, float_type=np.float32, opset: int = OPSET):
        self.name = name
        self.float_type = np.dtype(float_type).type
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._consts: dict[tuple, str] = {}
        self._ids = itertools.count()
        self._names: set[str] = set()

    # -- values ---------------------------------------------------------------------------
    def fresh(self, hint: str = "v") -> str:
        name = f"{hint}_{next(self._ids)}"
        self._names.add(name)
        return name

    @property
    def float_elem(self) -> int:
        return elem_type(self.float_type)

    def input(self, name: str, dtype, shape) -> str:
        """Declare a graph input; `dtype` "float" means the builder's float type."""
        et = self.float_elem if dtype == "float" else elem_type(dtype)
        self.inputs.append(helper.make_tensor_value_info(name, et, shape))
        return name

    def output(self, value: str, name: str, dtype, shape) -> str:
        """Expose `value` as graph output `name` (an Identity node renames it)."""
        et = self.float_elem if dtype == "float" else elem_type(dtype)
        self.nodes.append(helper.make_node("Identity", [value], [name]))
        self.outputs.append(helper.make_tensor_value_info(name, et, shape))
        return name

    def const(self, value, dtype=None) -> str:
        """A constant (cached). Python floats and float arrays take the builder's float type."""
        arr = np.array(value, copy=True)  # not ascontiguousarray: it turns 0-d into 1-d
        if dtype is not None:
            arr = arr.astype(dtype)
        elif arr.dtype.kind == "f":
            arr = arr.astype(self.float_type)
        elif arr.dtype.kind in "iu":
            arr = arr.astype(np.int64)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.fresh("const")
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def weight(self, name: str, array: np.ndarray, dtype=None) -> str:
        """An initializer; float weights are cast to the builder's float type unless dtype says."""
        arr = np.asarray(array)
        if dtype is not None:
            arr = arr.astype(dtype)
        elif arr.dtype.kind == "f":
            arr = arr.astype(self.float_type)
        if name in self._names:
            name = self.fresh(name)
        self._names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    # -- ops ------------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str | None, outputs: int = 1, name: str | None = None,
           domain: str = "", **attrs):
        """Append a node (of ONNX Runtime's contrib ops with `domain` "com.microsoft"); returns its
        output name, or a list when outputs > 1. None inputs are left out (empty names)."""
        outs = [self.fresh(op_type.lower()) for _ in range(outputs)]
        ins = ["" if i is None else i for i in inputs]
        self.nodes.append(helper.make_node(op_type, ins, outs, name=name or outs[0], domain=domain, **attrs))
        return outs[0] if outputs == 1 else outs

    def reduce(self, op_type: str, x: str, axes: list[int], keepdims: int = 1) -> str:
        """A Reduce* node over `axes`: an attribute up to opset 17, an input from 18 on (ReduceSum's
        since 13)."""
        if self.opset >= 18 or op_type == "ReduceSum":
            return self.op(op_type, x, self.const(axes), keepdims=keepdims)
        return self.op(op_type, x, axes=axes, keepdims=keepdims)

    # -- common blocks --------------------------------------------------------------------
    def linear(self, x: str, weight_out_in: np.ndarray, bias: np.ndarray | None, prefix: str) -> str:
        """x @ W.T (+ b) for a PyTorch Linear weight [out, in]."""
        y = self.op("MatMul", x, self.weight(prefix + ".weight", np.ascontiguousarray(weight_out_in.T)))
        if bias is not None:
            y = self.op("Add", y, self.weight(prefix + ".bias", bias))
        return y

    def rms_norm(self, x: str, weight: str | np.ndarray, eps: float, prefix: str = "rms_norm.weight") -> str:
        """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * w (`weight`: an initializer name
        or an array to register as `prefix`).

        Written as the Pow/ReduceMean/Add/Sqrt/Div/Mul chain that ONNX Runtime fuses into one
        SimplifiedLayerNormalization kernel (six nodes per norm otherwise)."""
        w = weight if isinstance(weight, str) else self.weight(prefix, weight)
        ms = self.reduce("ReduceMean", self.op("Pow", x, self.const(2.0)), [-1], keepdims=1)
        rms = self.op("Sqrt", self.op("Add", ms, self.const(eps)))
        return self.op("Mul", self.op("Div", x, rms), w)

    def silu(self, x: str) -> str:
        return self.op("Mul", x, self.op("Sigmoid", x))

    # -- output ---------------------------------------------------------------------------
    def model(self, metadata: dict[str, str] | None = None, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        domains = sorted({n.domain for n in self.nodes if n.domain})
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)]
                                  + [helper.make_opsetid(d, 1) for d in domains],
                                  producer_name="qwen3_tts_gguf", doc_string=doc)
        model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", self.opset)])
        for key, value in (metadata or {}).items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, str(value)
        return model


def save_model(model: onnx.ModelProto, path: str | Path, external: bool = False) -> list[Path]:
    """Save a model, its weights in a `.data` file beside it when `external` or when they exceed
    protobuf's limit; returns the files written."""
    path = Path(path)
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    if not external and weight_bytes < EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, str(path))
        return [path]
    data = path.with_suffix(path.suffix + ".data")
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    return [path, data]


def save_model_sharing_weights(model: onnx.ModelProto, path: str | Path, shared: str | Path) -> list[Path]:
    """Save `model` at `path` reading every initializer that the saved graph `shared` holds in its external
    data file under the same name and with the same bytes from that file (no second copy on disk); the
    others stay inside `path`. Returns the files written."""
    path, shared = Path(path), Path(shared)
    entries = {t.name: {e.key: e.value for e in t.external_data}
               for t in onnx.load(str(shared), load_external_data=False).graph.initializer
               if t.data_location == TensorProto.EXTERNAL}
    if path.parent.resolve() != shared.parent.resolve():
        raise ValueError(f"{path} must be saved beside {shared}: data files are found by a relative name")
    files = {e["location"] for e in entries.values()}
    handles = {f: open(shared.parent / f, "rb") for f in files}
    try:
        for t in model.graph.initializer:
            e = entries.get(t.name)
            if e is None or not t.raw_data or int(e["length"]) != len(t.raw_data):
                continue
            f = handles[e["location"]]
            f.seek(int(e["offset"]))
            if f.read(len(t.raw_data)) != t.raw_data:
                continue
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            del t.external_data[:]
            for key in ("location", "offset", "length"):
                t.external_data.add(key=key, value=e[key])
    finally:
        for f in handles.values():
            f.close()
    onnx.save_model(model, str(path))
    return [path]
