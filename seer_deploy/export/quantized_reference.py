"""The torch reference of a quantized export in its own scheme: the float32 model with every weight the export
quantized replaced by its quantized values (ONNX Runtime's block quantizer, as export.quantize calls it, then
dequantized), read from the checkpoint, never from the export.

Against float32, an honest int4 export moves each logit by a tenth of the logits' spread, and so would a graph with
one projection of a small model replaced by noise: a bound on the distance to float32 cannot tell the two apart. The
export's distance to torch running the same quantized numbers can: it is rounding only (MatMulNBits rounds the
activations to int8 at its accuracy level), a few thousandths of the spread, whatever the scheme; a wrong weight, a
wrong kernel or a wrong fusion is far above it. Which weights are quantized is read from the export's graph (the
initializers its MatMulNBits / DequantizeLinear nodes read), so the reference quantizes exactly those.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graphs import STEP
from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.export.quantize import positive_scales, signed_rows
from seer_deploy.export.streamed_reference import streamed_references
from seer_deploy.export.validate import ExportValidationError, Probe, ProbeReference
from seer_deploy.models.checkpoints.weight_sources import WeightSource
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor

PARAMETER_PREFIX = "model."  # the step modules hold the MaskPredictor as `model` (export.graphs)
_QUANTIZED_INPUT = {"MatMulNBits": 1, "DequantizeLinear": 0}  # which input of each op is the quantized weight


def quantized_parameters(graph_file: Path, model: nn.Module | None = None, quant: Quantization | None = None,
                         head_widths: tuple[int, ...] = ()) -> set[str]:
    """The model's parameter names (MaskPredictor's) whose weights the graph holds quantized. A streamed export names
    its initializers '<parameter>[.T].q<bits>' (export.quantize after export.streamed_weights' transpose folding); a
    loaded model's (`model`, `quant`: the multimodal export) lose their names to the exporter's optimizer, so there
    they are the Linear weights quantize_graph takes (input width a multiple of the block; not the head with
    --keep-head), and ExportValidationError unless the graph holds as many."""
    graph = onnx.load(str(graph_file), load_external_data=False)
    names = set()
    for node in graph.graph.node:
        index = _QUANTIZED_INPUT.get(node.op_type)
        if index is None:
            continue
        name = node.input[index].rsplit(".", 1)[0].removeprefix(PARAMETER_PREFIX)
        names.add(name.removesuffix(".T"))
    if model is None or quant is None or names <= dict(model.named_parameters()).keys():
        return names
    linear = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Linear)
              and module.in_features % quant.block_size == 0
              and not (quant.keep_head and module.out_features in head_widths)}
    if len(linear) != len(names):
        raise ExportValidationError(f"{graph_file.name} holds {len(names)} quantized weights where the model has "
                                    f"{len(linear)} projections to quantize: its quantized reference cannot be built")
    return linear


def dequantized(weight: torch.Tensor, quant: Quantization) -> torch.Tensor:
    """A Linear weight [N, K] (out, in) as the export's quantized numbers give it back, float32 [N, K]: blocks of
    quant.block_size along K, symmetric, ONNX Runtime's quantizer (export.quantize.QuantizedWeight.parts)."""
    from onnxruntime.capi import _pybind_state as ort_c

    N, K = weight.shape
    bs, bits = quant.block_size, quant.bits
    packed = np.zeros((N, K // bs, bs * bits // 8), dtype=np.uint8)
    scales = np.zeros((N, K // bs), dtype=np.float32)
    zero_points = np.zeros((N, (K // bs * bits + 7) // 8), dtype=np.uint8)
    quantizer = ort_c.quantize_matmul_4bits if bits == 4 else ort_c.quantize_matmul_8bits
    quantizer(packed, np.ascontiguousarray(weight.float().numpy().T), scales, zero_points, bs, N, K, True)
    if bits == 8:
        positive_scales(packed, scales)
    values = signed_rows(packed, bits, K).astype(np.float32).reshape(N, K // bs, bs)
    return torch.from_numpy((values * scales[:, :, None]).reshape(N, K))


@dataclass(frozen=True)
class DequantizedSource(WeightSource):
    """A checkpoint weight read as the export's quantized numbers (float32 before any conversion)."""

    quant: Quantization | None = None

    def read_as(self, dtypes: list[torch.dtype]) -> list[torch.Tensor]:  # type: ignore[override]
        assert self.quant is not None
        full = super().read_as([torch.float32])[0]
        values = dequantized(full, self.quant)
        return [values.to(dtype) for dtype in dtypes]


def dequantized_sources(sources: dict[str, WeightSource], names: set[str],
                        quant: Quantization) -> dict[str, WeightSource]:
    """`sources` with each of `names` read quantized."""
    return {name: DequantizedSource(**vars(source), quant=quant) if name in names else source
            for name, source in sources.items()}


@torch.no_grad()
def dequantized_model(model: MaskPredictor, names: set[str], quant: Quantization) -> MaskPredictor:
    """A copy of a loaded model with each of `names` holding the export's quantized numbers."""
    twin = copy.deepcopy(model)
    parameters = dict(twin.named_parameters())
    for name in names:
        parameters[name].copy_(dequantized(parameters[name], quant).to(parameters[name].dtype))
    return twin


def own_references(staged: Path, quant: Quantization, cfg: ModelConfig, sources: dict[str, WeightSource],
                   spec: StatsSpec, probes: list[Probe]) -> list[ProbeReference]:
    """The probes' torch references with every weight the staged export's step graph quantized read quantized,
    one layer at a time (a streamed export: export.streamed_reference)."""
    names = quantized_parameters(staged / ExportManifest.load(staged).graphs[STEP.name].file)
    return streamed_references(cfg, dequantized_sources(sources, names, quant), spec, probes)[torch.float32]
