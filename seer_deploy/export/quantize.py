"""Weight-only quantization of a traced graph (`export --quantize`): each MatMul that reads a 2-D weight becomes a
MatMulNBits, or a blocked DequantizeLinear before the MatMul (contracts.quantization), whose quantized weight and
scales are lazy initializers: quantized when the weights file is written, one projection at a time, from the float32
checkpoint tensor (a streamed export never holds the model), by ONNX Runtime's own block quantizer
(`quantize_matmul_{4,8}bits`, what its MatMulNBitsQuantizer calls). The DequantizeLinear form holds the same numbers
in the [K, N] signed layout ONNX's INT4 / INT8 types define, so the two forms of an export compute the same model.

A quantized weight is keyed by its source and the quantization, so the step graphs share one copy in the weights file
as they share the float weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
import torch

from seer_deploy.contracts.graphs import CACHE_GRAPH_NAMES, PROMPT_CACHE_GRAPH_NAMES, STEP_GRAPH_NAMES
from seer_deploy.contracts.quantization import ACCURACY_LEVEL, Quantization
from seer_deploy.export.streamed_weights import CheckpointTensor, ExportedWeight

MS_DOMAIN = "com.microsoft"
QUANTIZED_GRAPHS = STEP_GRAPH_NAMES + CACHE_GRAPH_NAMES + PROMPT_CACHE_GRAPH_NAMES  # the language model's: a vision tower keeps its dtype
_FLOATS = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}


@dataclass(frozen=True)
class QuantizedWeight:
    """One projection's weight [K, N] as quantized: `parts()` gives the initializers' arrays by part name."""

    key: Hashable  # the float weight's identity: its checkpoint source, or its bytes' hash for a loaded one
    quant: Quantization
    scale_dtype: ir.DataType  # the export's dtype (what MatMulNBits and DequantizeLinear take the scales in)
    shape: tuple[int, int]
    read: Callable[[], np.ndarray] = field(compare=False, hash=False)  # -> float32 [K, N]

    def part_specs(self) -> dict[str, tuple[ir.DataType, tuple[int, ...]]]:
        """Each part's element type and shape, as the graph declares them."""
        K, N = self.shape
        bs, bits = self.quant.block_size, self.quant.bits
        if self.quant.format == "nbits":
            return {"q": (ir.DataType.UINT8, (N, K // bs, bs * bits // 8)), "scales": (self.scale_dtype, (N, K // bs))}
        qtype = ir.DataType.INT4 if bits == 4 else ir.DataType.INT8
        return {"q": (qtype, (K, N)), "scales": (self.scale_dtype, (K // bs, N))}

    def parts(self) -> dict[str, ir.TensorProtocol]:
        """Quantize the weight (read now) with ONNX Runtime's block quantizer; the parts in the graph's layout."""
        from onnxruntime.capi import _pybind_state as ort_c

        K, N = self.shape
        bs, bits = self.quant.block_size, self.quant.bits
        weight = np.ascontiguousarray(self.read(), dtype=np.float32)
        packed = np.zeros((N, K // bs, bs * bits // 8), dtype=np.uint8)
        scales = np.zeros((N, K // bs), dtype=np.float32)
        zero_points = np.zeros((N, (K // bs * bits + 7) // 8), dtype=np.uint8)  # unused: symmetric
        quantizer = ort_c.quantize_matmul_4bits if bits == 4 else ort_c.quantize_matmul_8bits
        quantizer(packed, weight, scales, zero_points, bs, N, K, True)
        del weight
        if bits == 8:
            positive_scales(packed, scales)
        scale_type = _FLOATS[self.scale_dtype]
        if self.quant.format == "nbits":
            return {"q": ir.tensor(packed), "scales": ir.tensor(scales.astype(scale_type))}
        return {"q": ir.tensor(signed_rows(packed, bits, K).T.copy()),
                "scales": ir.tensor(np.ascontiguousarray(scales.T, dtype=scale_type))}


def positive_scales(packed: np.ndarray, scales: np.ndarray) -> None:
    """In place: make every 8-bit block's scale positive (TensorRT's parser refuses negative int8 scales).

    ONNX Runtime's symmetric quantizer maps a block's largest-magnitude weight to -128, so a block whose largest weight
    is positive gets a negative scale. Negating the scale and the values is exact except for that weight: -(-128) is
    128, one past int8, held as 127 (one step, 1/128 of the block's largest weight, on one weight per such block).
    Both forms hold the result, so an nbits and a qdq export compute the same model."""
    negative = scales < 0
    blocks = packed.reshape(packed.shape[0], packed.shape[1], -1)  # unsigned, zero point 128
    flipped = np.clip(256 - blocks.astype(np.int16), 1, 255).astype(np.uint8)  # 128 - (q - 128), capped at +127
    blocks[negative] = flipped[negative]
    scales[negative] = -scales[negative]


def signed_rows(packed: np.ndarray, bits: int, K: int) -> np.ndarray:
    """MatMulNBits' packing [N, K/bs, bytes] (unsigned, zero point 2^(bits-1) when symmetric, element 2i in the low
    nibble) -> the signed values [N, K] as ONNX's INT4 / INT8 hold them."""
    import ml_dtypes

    flat = packed.reshape(packed.shape[0], -1)
    if bits == 8:
        return (flat.astype(np.int16) - 128).astype(np.int8)
    values = np.empty((flat.shape[0], K), dtype=np.int8)
    values[:, 0::2] = (flat & 0xF).astype(np.int8) - 8
    values[:, 1::2] = (flat >> 4).astype(np.int8) - 8
    return values.astype(ml_dtypes.int4)


class QuantizedTensor(ir.LazyTensor):
    """One part of a quantized weight: the weights file writes every part of its weight at once (weights.py)."""

    __slots__ = ("part", "weight")

    def __init__(self, weight: QuantizedWeight, part: str, name: str) -> None:
        dtype, shape = weight.part_specs()[part]
        super().__init__(lambda: weight.parts()[part], dtype=dtype, shape=ir.Shape(shape), name=name)
        self.weight, self.part = weight, part


@dataclass(frozen=True)
class QuantizedGraph:
    """What quantize_graph did: the projections it quantized and the ones it left in the export's dtype (why)."""

    quantized: tuple[str, ...]
    kept: dict[str, str]


def quantize_graph(model: ir.Model, quant: Quantization, head_widths: tuple[int, ...]) -> QuantizedGraph:
    """Rewrite every MatMul of `model` that reads a 2-D floating-point weight; `head_widths`: the output widths that
    mark the LM head (the vocabulary), kept when quant.keep_head."""
    graph = model.graph
    quantized: list[str] = []
    kept: dict[str, str] = {}
    for node in list(graph):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        a, b = node.inputs
        tensor = b.const_value if b is not None else None
        if a is None or b is None or tensor is None or tensor.dtype not in _FLOATS or len(tensor.shape) != 2:
            continue
        name = b.name or ""
        K, N = (int(d) for d in tensor.shape.numpy())
        if quant.keep_head and N in head_widths:
            kept[name] = "the LM head (--keep-head)"
            continue
        if K % quant.block_size:
            kept[name] = f"{K} input rows are not a multiple of the block size {quant.block_size}"
            continue
        key, read = _source(tensor)
        weight = QuantizedWeight(key, quant, tensor.dtype, (K, N), read)
        q, scales = (ir.Value(name=f"{name}.{part}{quant.bits if part == 'q' else ''}",
                              type=ir.TensorType(weight.part_specs()[part][0]),
                              shape=ir.Shape(weight.part_specs()[part][1]),
                              const_value=QuantizedTensor(weight, part, f"{name}.{part}"))
                     for part in ("q", "scales"))
        if quant.format == "nbits":
            new_nodes = [ir.node("MatMulNBits", [a, q, scales], domain=MS_DOMAIN,
                                 attributes={"K": K, "N": N, "bits": quant.bits, "block_size": quant.block_size,
                                             "accuracy_level": ACCURACY_LEVEL})]
        else:
            dequantized = ir.node("DequantizeLinear", [q, scales],
                                  attributes={"axis": 0, "block_size": quant.block_size})
            new_nodes = [dequantized, ir.node("MatMul", [a, dequantized.outputs[0]])]
        ir.convenience.replace_nodes_and_values(graph, node, [node], new_nodes, node.outputs, new_nodes[-1].outputs)
        for value in (q, scales):
            graph.register_initializer(value)
        if not b.uses():
            graph.initializers.pop(name)
        quantized.append(name)
    if quantized and quant.format == "nbits":
        model.opset_imports[MS_DOMAIN] = 1
    return QuantizedGraph(tuple(quantized), kept)


def quantized_record(graphs: Mapping[str, QuantizedGraph]) -> dict[str, Any]:
    """The manifest's account of --quantize: projections quantized per graph, each one kept in full precision (why)."""
    kept: dict[str, str] = {}
    for graph in graphs.values():
        kept |= graph.kept
    return {"projections": {name: len(graph.quantized) for name, graph in graphs.items()}, "kept": kept}


def _source(tensor: ir.TensorProtocol) -> tuple[Hashable, Callable[[], np.ndarray]]:
    """A weight's identity and a reader of it in float32: from the checkpoint for a streamed weight (in float32
    whatever the export's dtype: the scales are computed from the checkpoint's values), else from memory."""
    if isinstance(tensor, CheckpointTensor):
        exported = tensor.weight
        full = ExportedWeight(exported.source, torch.float32, exported.perm)
        return exported, lambda: full.array()
    data = tensor.numpy()
    key = ("bytes", hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest(), data.shape, str(data.dtype))
    return key, lambda: data.astype(np.float32)
