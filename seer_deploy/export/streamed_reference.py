"""The torch reference of a streamed export, computed one transformer layer at a time, each layer read once.

The model is built on the meta device, once per dtype the check needs (float32, and the export's dtype for what that
dtype alone moves). Every forward (one per probe and dtype) runs in a thread of its own; the forwards meet at each
layer (a forward pre-hook and a forward hook, synchronised by a barrier): the first to arrive reads the layer's
weights from the checkpoint once and converts them to every dtype, all run it, the last to leave drops it. The
embedding, final norm and LM head are read for the whole computation. So the reference of an 8B model needs the head
and embedding plus one layer (about 8 GB for LLaDA-8B with the float16 copy), not 32 GB, reads the checkpoint once
(re-reading it per probe from a disk that cannot cache it took most of an 8B export's time), and everything it read
is released before ONNX Runtime opens the graphs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import ExitStack

import torch

from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.export.validate import Probe, ProbeReference, torch_references
from seer_deploy.models.checkpoints.weight_sources import WeightSource, materialized
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor

TOP_LEVEL = ("embed.", "final_norm.", "lm_head.")


class _LayerMeeting:
    """Where the forwards meet at each layer: its weights are read once for all of them, and dropped after."""

    def __init__(self, models: dict[torch.dtype, MaskPredictor], sources: dict[str, WeightSource],
                 forwards: int) -> None:
        self.models, self.sources = models, sources
        self.barrier = threading.Barrier(forwards)
        self.held: ExitStack | None = None

    def enter(self, index: int) -> None:
        if self.barrier.wait() == 0:
            self.held = ExitStack()
            self.held.enter_context(materialized(self.models, self.sources, f"layers.{index}."))
        self.barrier.wait()  # the layer is there for everyone

    def leave(self, index: int) -> None:
        if self.barrier.wait() == 0 and self.held is not None:
            self.held.close()
            self.held = None
        self.barrier.wait()


@torch.no_grad()
def streamed_references(cfg: ModelConfig, sources: dict[str, WeightSource], spec: StatsSpec, probes: list[Probe],
                        dtypes: Sequence[torch.dtype] = (torch.float32,)) -> dict[torch.dtype, list[ProbeReference]]:
    """`torch_references` of the checkpoint's model in each of `dtypes`, one layer's weights held at a time."""
    models: dict[torch.dtype, MaskPredictor] = {}
    for dtype in dtypes:
        with torch.device("meta"):
            models[dtype] = MaskPredictor(cfg).to(dtype).eval().requires_grad_(False)
    jobs = [(dtype, k) for dtype in dtypes for k in range(len(probes))]
    meeting = _LayerMeeting(models, sources, len(jobs))
    results: dict[tuple[torch.dtype, int], ProbeReference] = {}
    errors: list[BaseException] = []

    def forward(dtype: torch.dtype, k: int) -> None:
        try:
            with torch.no_grad():
                results[dtype, k] = torch_references(models[dtype], spec, [probes[k]])[0]
        except BaseException as exc:  # noqa: BLE001 (re-raised by the caller; the others must not wait for it)
            errors.append(exc)
            meeting.barrier.abort()

    with ExitStack() as stack:
        for prefix in TOP_LEVEL:
            stack.enter_context(materialized(models, sources, prefix))
        for model in models.values():
            for i, layer in enumerate(model.layers):
                stack.callback(layer.register_forward_pre_hook(lambda module, args, i=i: meeting.enter(i)).remove)
                stack.callback(layer.register_forward_hook(lambda module, args, out, i=i: meeting.leave(i)).remove)
        threads = [threading.Thread(target=forward, args=job, name=f"reference-{k}", daemon=True)
                   for k, job in enumerate(jobs)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            meeting.barrier.abort()  # an interrupted run: the forwards still waiting at a layer stop there
        if meeting.held is not None:
            meeting.held.close()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return {dtype: [results[dtype, k] for k in range(len(probes))] for dtype in dtypes}
