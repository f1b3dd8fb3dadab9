"""One copy of an export's weights for every ONNX Runtime session of a process (CPU).

ONNX Runtime memory-maps page-aligned external data already; what copies the weights is MLAS prepacking, a private
copy of every MatMul weight per session (shared/reference/ort-shared-weights.md). So every external initializer is
handed to each session as a view of one read-only memory map of weights.bin (`SessionOptions.add_initializer`: used
in place, never copied), with prepacking off; the sessions also allocate their activations from one arena
registered with the process-wide environment. Graphs that read the same bytes get the same OrtValue.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import onnxruntime as ort

from seer_deploy.core.errors import ArtifactError
from seer_deploy.engines.onnx_proto import NUMPY_TYPES, external_initializers

TensorKey = tuple[int, int, int, tuple[int, ...]]  # offset, length, ONNX data type, dims
# Two values per byte: numpy cannot view them in place, so ONNX Runtime reads these from the file itself (the int4
# weights of a `--quant-format qdq` export, which its optimizer turns into MatMulNBits anyway).
_PACKED_TYPES = frozenset({22, 21})  # onnx.TensorProto.INT4, UINT4


class SharedWeights:
    """A read-only memory map of one weights file and the OrtValues viewing it, kept as long as the sessions."""

    def __init__(self, weights_file: Path) -> None:
        self.file = weights_file
        self.mapping: np.memmap | None = None  # opened with the first session
        self.values: dict[TensorKey, ort.OrtValue] = {}

    def add_to(self, options: ort.SessionOptions, graph_file: Path, arena: bool = True, prepack: bool = False) -> None:
        """Hand the session every external initializer of `graph_file` (whose external data was checked to lie in
        its directory) as a view of the mapping, turn prepacking off unless `prepack` and (with `arena`) share the
        environment's arena (OrtBackend.prepacks says when to prepack)."""
        if self.mapping is None:
            self.mapping = np.memmap(self.file, dtype=np.uint8, mode="r")
        size = self.mapping.size
        try:
            tensors = external_initializers(graph_file)
        except ValueError as exc:
            raise ArtifactError(f"{graph_file}: an initializer's external data is malformed ({exc}); re-export the "
                                "model") from exc
        for init in tensors:
            if init.data_type in _PACKED_TYPES:
                continue
            key = (init.offset, init.length, init.data_type, init.dims)
            try:
                dtype = NUMPY_TYPES[init.data_type]
                if init.location != self.file.name or not 0 <= init.offset <= init.offset + init.length <= size:
                    raise ValueError(f"bytes {init.offset}..{init.offset + init.length} of {init.location}")
                if key not in self.values:
                    array = self.mapping[init.offset : init.offset + init.length].view(dtype).reshape(init.dims)
                    self.values[key] = ort.OrtValue.ortvalue_from_numpy(array)
            except (ValueError, KeyError) as exc:
                raise ArtifactError(f"{graph_file}: initializer {init.name} does not fit {self.file} ({exc}); "
                                    "re-export the model") from exc
            options.add_initializer(init.name, self.values[key])
        if not prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        if arena:
            share_cpu_arena(options)


    def release_pages(self) -> None:
        """Drop the mapping's resident pages from this process (MADV_DONTNEED on a read-only file mapping: the page
        cache keeps them, the next read faults them back in). Called after a session that prepacks opens: prepacking
        read every quantized weight once into ONNX Runtime's packed copy, and those pages of the file would otherwise
        stay resident beside it (measured on a 362M int4 export: the packed weights counted twice)."""
        raw = getattr(self.mapping, "_mmap", None)
        if raw is not None and hasattr(raw, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            raw.madvise(mmap.MADV_DONTNEED)


def share_cpu_arena(options: ort.SessionOptions) -> None:
    """Let the session allocate its activations from the environment's CPU arena, registered once per process and
    shared by every session that asks (ONNX Runtime's environment is process-wide; registering it again keeps the
    first), instead of an arena of its own: sessions run one after another, so one arena serves them all (measured:
    half the activation memory)."""
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, None)
    options.add_session_config_entry("session.use_env_allocators", "1")
