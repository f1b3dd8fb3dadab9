"""One external-data file for both graphs: every initializer is written once and referenced by offset.

Both graphs hold the same weights (the exporter folds e.g. transposed projections into new initializers with
graph-local names), so tensors are deduplicated by content, not by name; a weight streamed from the checkpoint
(export.streamed_weights) by its source instead, and written straight from the buffer it was read into, so the file
grows one tensor at a time and `on_write` hears each (bytes written, the tensor's name). Keeping the weights out of the .onnx
protobuf also keeps every graph far below protobuf's 2 GB limit, whatever the model size. Offsets are aligned so
that ONNX Runtime can memory-map large tensors; padding is zeros, so the file is byte-for-byte reproducible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np
import onnx_ir as ir

from seer_deploy.export.quantize import QuantizedTensor
from seer_deploy.export.streamed_weights import CheckpointTensor

WEIGHTS_FILE = "weights.bin"
INLINE_LIMIT_BYTES = 1024  # initializers smaller than this (shape constants, scalars) stay inside the .onnx
_LARGE = 1 << 20  # tensors from 1 MiB on start at a 64 KiB boundary (mmap granularity on every OS)
_LARGE_ALIGN, _SMALL_ALIGN = 1 << 16, 64
_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


class SharedWeightFile:
    """Appends tensor bytes to DIR/weights.bin, returning (offset, length); identical bytes are stored once."""

    def __init__(self, directory: Path, name: str = WEIGHTS_FILE,
                 on_write: Callable[[int, str], None] | None = None) -> None:
        self.directory = directory
        self.name = name
        self.on_write = on_write
        self._fh = open(directory / name, "wb")  # noqa: SIM115 (closed by close() / the context manager)
        self._offsets: dict[Hashable, int] = {}
        self._claimed: set[Hashable] = set()  # quantized parts some graph reads already
        self._hash = hashlib.sha256()
        self.size = 0
        self.tensors_written = 0
        self.tensors_shared = 0

    def add(self, data: bytes | memoryview, key: Hashable | None = None, name: str = "") -> tuple[int, int]:
        """Append `data` (once per `key`: by default its content) -> (offset, length)."""
        length = len(data) if isinstance(data, bytes) else data.nbytes
        key = (hashlib.sha256(data).hexdigest(), length) if key is None else key
        if key in self._offsets:
            self.tensors_shared += 1
            return self._offsets[key], length
        align = _LARGE_ALIGN if length >= _LARGE else _SMALL_ALIGN
        pad = -self.size % align
        if pad:
            self._write(b"\0" * pad)
        offset = self.size
        self._write(data)
        self._offsets[key] = offset
        self.tensors_written += 1
        if self.on_write is not None:
            self.on_write(self.size, name)
        return offset, length

    def _write(self, data: bytes | memoryview) -> None:
        self._fh.write(data)
        self._hash.update(data)
        self.size += len(data) if isinstance(data, bytes) else data.nbytes

    def _add_quantized(self, tensor: QuantizedTensor, name: str) -> tuple[int, int]:
        """(offset, length) of one part of a quantized weight: on its first part the weight is quantized (read from
        its source) and every part written; the other parts, and other graphs' uses, find them written."""
        key = (tensor.weight, tensor.part)
        if key not in self._offsets:
            for part, array in tensor.weight.parts().items():
                self.add(array.tobytes(), key=(tensor.weight, part), name=f"{name} ({part})")
        if key in self._claimed:
            self.tensors_shared += 1
        self._claimed.add(key)
        return self._offsets[key], tensor.nbytes

    def pending_bytes(self, model: ir.Model, inline_limit_bytes: int = INLINE_LIMIT_BYTES) -> int:
        """What `externalize(model)` would write into an empty file, less alignment: the progress bar's total."""
        seen: set[Hashable] = set()
        total = 0
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, QuantizedTensor):
                key: Hashable = (tensor.weight, tensor.part)
            elif tensor is not None and tensor.dtype in _FLOAT_TYPES and tensor.nbytes >= max(inline_limit_bytes, 1):
                key = tensor.weight if isinstance(tensor, CheckpointTensor) else id(tensor)
            else:
                continue
            if key not in seen:
                seen.add(key)
                total += tensor.nbytes
        return total

    def sha256(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def externalize(self, model: ir.Model, inline_limit_bytes: int = INLINE_LIMIT_BYTES) -> int:
        """Move every floating-point initializer of at least `inline_limit_bytes` into the file; returns how many.

        Integer initializers (shapes, axes, indices) stay inline whatever their size: shape inference (the ONNX
        checker) and TensorRT's shape-tensor handling read their values, which they cannot do from external data.
        """
        moved = 0
        for name, value in model.graph.initializers.items():
            tensor = value.const_value
            if isinstance(tensor, QuantizedTensor):  # every part, whatever its size: they are written together
                offset, length = self._add_quantized(tensor, name)
                value.const_value = ir.ExternalTensor(self.name, offset, length, tensor.dtype,
                                                      shape=ir.Shape(tensor.shape.numpy()), name=name,
                                                      base_dir=self.directory)
                moved += 1
                continue
            if tensor is None or tensor.dtype not in _FLOAT_TYPES or tensor.nbytes < max(inline_limit_bytes, 1):
                continue
            if isinstance(tensor, CheckpointTensor):  # read now, written from its buffer, then dropped
                array = np.ascontiguousarray(tensor.weight.array())
                offset, length = self.add(memoryview(array.data).cast("B"), key=tensor.weight, name=name)
                del array
            else:
                offset, length = self.add(tensor.tobytes(), name=name)
            value.const_value = ir.ExternalTensor(
                self.name, offset, length, tensor.dtype, shape=ir.Shape(tensor.shape.numpy()), name=name, base_dir=self.directory
            )
            moved += 1
        return moved
