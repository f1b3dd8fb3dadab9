"""The torch reference of a streamed export, computed one transformer layer at a time.

The model is built on the meta device; the embedding, final norm and LM head are read for the whole computation,
each layer's weights only while that layer runs (a forward pre-hook reads them, a forward hook drops them). So the
reference of an 8B model in float32 needs the head and embedding plus one layer (about 5 GB for LLaDA-8B), not 32 GB,
and everything it read is released before ONNX Runtime opens the graphs. Each probe reads every layer again: the
checkpoint is read once per probe and dtype (from the page cache after the first).
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.export.validate import Probe, ProbeReference, torch_references
from seer_deploy.models.config import ModelConfig
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.models.weight_sources import WeightSource, materialized

TOP_LEVEL = ("embed.", "final_norm.", "lm_head.")


@torch.no_grad()
def streamed_references(cfg: ModelConfig, sources: dict[str, WeightSource], spec: StatsSpec, probes: list[Probe],
                        dtype: torch.dtype = torch.float32) -> list[ProbeReference]:
    """`torch_references` of the checkpoint's model in `dtype`, holding one layer's weights at a time."""
    with torch.device("meta"):
        model = MaskPredictor(cfg)
    model.to(dtype).eval().requires_grad_(False)
    with ExitStack() as top:
        for prefix in TOP_LEVEL:
            top.enter_context(materialized(model, sources, dtype, prefix))
        held: dict[int, ExitStack] = {}

        def enter(index: int) -> None:
            held[index] = ExitStack()
            held[index].enter_context(materialized(model, sources, dtype, f"layers.{index}."))

        def leave(index: int) -> None:
            held.pop(index).close()

        handles = []
        for i, layer in enumerate(model.layers):
            handles.append(layer.register_forward_pre_hook(lambda module, args, i=i: enter(i)))
            handles.append(layer.register_forward_hook(lambda module, args, out, i=i: leave(i)))
        try:
            return torch_references(model, spec, probes)
        finally:
            for handle in handles:
                handle.remove()
            for stack in held.values():
                stack.close()
