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
        ms = self.op("ReduceMean", self.op("Pow", x, self.const(2.0)), axes=[-1], keepdims=1)
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
        model.ir_version = 8
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
