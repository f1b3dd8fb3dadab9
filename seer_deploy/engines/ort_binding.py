"""ONNX Runtime calls through IO binding: buffers on the session's device, kept per call shape, and on CUDA one
captured CUDA graph per shape.

Why: `session.run(feed)` allocates every input and output each call and, on CUDA, copies them both ways; for a small
model that host work is most of a step (issue 23 measured 3-4 ms a pass on an H200 for microseconds of arithmetic).
With a `BoundSession` a call's inputs are written into buffers that already exist on the device (the sequence: B x S
ids, a mask and the sampling inputs), the graph runs, and only the compact outputs (ids and confidence, step zero's
statistics) come back to the host. With `cuda_graph`, ONNX Runtime captures a call of each shape once and replays
it (`gpu_graph_id` = the shape's index); a captured graph needs fixed shapes and addresses, so `FixedShapes` rounds
the batch and sequence axes up (padding rows repeat row 0, padding columns are masked out of attention and their
outputs dropped), which bounds the graphs to one per (batch size, length bucket).

With `device_cache` the block-wise KV cache stays on the device too: a refresh writes its keys and values into a
torch tensor there and a window step reads them from it (`run_with_device_tensors`); the runtime keeps, gathers and
updates the cache rows as torch tensors, never on the host.

On CPU the same code runs with host buffers: the tests check it against `session.run` token for token, padding
included. The CUDA-graph path itself runs only on a GPU (scripts/gpu_check.py); here it is type-checked and its
switch tested.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from seer_deploy.contracts.graphs import ATTENTION_MASK, GraphIO
from seer_deploy.core.backend import is_device_array
from seer_deploy.core.errors import ConfigError
from seer_deploy.engines.fixed_shapes import FixedShapes, pad_feed, unpad_outputs

GPU_GRAPH_ID = "gpu_graph_id"  # ONNX Runtime's run option naming the CUDA graph a call captures or replays
MAX_BOUND_SHAPES = 64  # buffer sets kept per session (least recently used dropped); CUDA graphs are never dropped


class _ShapeBuffers:
    """The bound buffers of one call shape: inputs written in place each call, outputs kept between calls (their
    addresses are what a captured CUDA graph reads and writes)."""

    def __init__(self, binding: ort.IOBinding, inputs: dict[str, ort.OrtValue], graph_id: int) -> None:
        self.binding = binding
        self.inputs = inputs
        self.outputs: dict[str, ort.OrtValue] | None = None  # bound after the first call allocated them
        self.graph_id = graph_id


class BoundSession:
    """Runs one graph's session through IO binding on `device` ("cpu" or "cuda"); `fixed_shapes` pads calls to
    shared shapes; `cuda_graph` captures one CUDA graph per shape (the session must have been made with the CUDA
    provider's `enable_cuda_graph`)."""

    def __init__(self, session: ort.InferenceSession, graph: GraphIO, *, device: str = "cpu", device_id: int = 0,
                 fixed_shapes: FixedShapes | None = None, cuda_graph: bool = False) -> None:
        if cuda_graph and (device != "cuda" or fixed_shapes is None):
            raise ConfigError("CUDA graphs need the CUDA provider and fixed shapes; use --provider "
                              "CUDAExecutionProvider (onnxruntime-gpu), or drop --cuda-graph")
        self.session, self.graph = session, graph
        self.device, self.device_id = device, device_id
        self.fixed_shapes, self.cuda_graph = fixed_shapes, cuda_graph
        self.outputs = list(graph.host_outputs)
        self._buffers: OrderedDict[tuple[tuple[int, ...], ...], _ShapeBuffers] = OrderedDict()
        self._graph_ids = 0
        self.calls = 0

    @property
    def shapes(self) -> int:
        """Distinct call shapes bound so far (with `cuda_graph`: CUDA graphs captured)."""
        return len(self._buffers)

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's host outputs for `feed` (named as declared), as `session.run` would return them."""
        batch, seq = self._call_size(feed)
        if self.fixed_shapes is not None:
            feed = pad_feed(self.graph, feed, self.fixed_shapes.batch(batch), self.fixed_shapes.seq(seq))
        buffers = self._bound(feed)
        for name, value in feed.items():
            buffers.inputs[name].update_inplace(value)
        options = ort.RunOptions()
        if self.cuda_graph:
            options.add_run_config_entry(GPU_GRAPH_ID, str(buffers.graph_id))
        self.session.run_with_iobinding(buffers.binding, options)
        self.calls += 1
        if buffers.outputs is None:  # the first call of this shape: keep what ONNX Runtime allocated, and bind it
            values = buffers.binding.get_outputs()
            buffers.outputs = dict(zip(self.outputs, values, strict=True))
            for name, value in buffers.outputs.items():
                buffers.binding.bind_ortvalue_output(name, value)
        host = {name: value.numpy() for name, value in buffers.outputs.items()}  # only these cross to the host
        return host if self.fixed_shapes is None else unpad_outputs(self.graph, host, batch, seq)

    def _call_size(self, feed: Mapping[str, np.ndarray]) -> tuple[int, int]:
        mask = feed[ATTENTION_MASK.name]  # [B, S] in every step graph and in the window graph
        return int(mask.shape[0]), int(mask.shape[1])

    def _bound(self, feed: Mapping[str, np.ndarray]) -> _ShapeBuffers:
        key = tuple(value.shape for value in feed.values())
        buffers = self._buffers.get(key)
        if buffers is not None:
            self._buffers.move_to_end(key)
            return buffers
        binding = self.session.io_binding()
        inputs = {}
        for name, value in feed.items():
            inputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(value.shape, value.dtype, self.device,
                                                                     self.device_id)
            binding.bind_ortvalue_input(name, inputs[name])
        for name in self.outputs:
            binding.bind_output(name, self.device, self.device_id)
        self._graph_ids += 1
        buffers = _ShapeBuffers(binding, inputs, self._graph_ids)
        self._buffers[key] = buffers
        if not self.cuda_graph and len(self._buffers) > MAX_BOUND_SHAPES:
            self._buffers.popitem(last=False)
        return buffers


_ELEMENT_TYPES = {"torch.float32": np.float32, "torch.float16": np.float16, "torch.int64": np.int64}


def run_with_device_tensors(session: ort.InferenceSession, graph: GraphIO, feed: Mapping[str, Any], *,
                            device: str, device_id: int, device_outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """One call through a fresh IO binding for graphs whose big tensor stays on the device (the KV cache): torch
    tensors in `feed` are bound where they lie, the outputs named in `device_outputs` are written into those
    (preallocated, contiguous) torch tensors, and only the other outputs come back to the host."""
    binding = session.io_binding()
    for name, value in feed.items():
        if is_device_array(value):
            binding.bind_input(name, device, device_id, _ELEMENT_TYPES[str(value.dtype)], tuple(value.shape),
                               value.data_ptr())
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
    for name in graph.host_outputs:
        target = device_outputs.get(name)
        if target is None:
            binding.bind_output(name, "cpu")
        else:
            binding.bind_output(name, device, device_id, _ELEMENT_TYPES[str(target.dtype)], tuple(target.shape),
                                target.data_ptr())
    session.run_with_iobinding(binding)
    values = binding.get_outputs()
    return {name: value.numpy() for name, value in zip(graph.host_outputs, values, strict=True)
            if name not in device_outputs}
