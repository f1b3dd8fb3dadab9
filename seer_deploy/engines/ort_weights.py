"""One copy of an export's weights for every ONNX Runtime session of a process (CPU).

ONNX Runtime memory-maps page-aligned external data already; what copies the weights is MLAS prepacking, a private
copy of every MatMul weight per session (shared/reference/ort-shared-weights.md). So every external initializer is
handed to each session as a view of one read-only memory map of weights.bin (`SessionOptions.add_initializer`: used
in place, never copied), with prepacking off; the sessions also allocate their activations from one arena
registered with the process-wide environment. Graphs that read the same bytes get the same OrtValue.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from seer_deploy.core.errors import ArtifactError

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
        import onnx

        if self.mapping is None:
            self.mapping = np.memmap(self.file, dtype=np.uint8, mode="r")
        size = self.mapping.size
        proto = onnx.load(str(graph_file), load_external_data=False)
        for init in proto.graph.initializer:
            if init.data_location != onnx.TensorProto.EXTERNAL or init.data_type in _PACKED_TYPES:
                continue
            ext = {e.key: e.value for e in init.external_data}
            try:
                offset, length = int(ext.get("offset") or 0), int(ext.get("length") or -1)
                key = (offset, length, init.data_type, tuple(init.dims))
                if ext.get("location") != self.file.name or not 0 <= offset <= offset + length <= size:
                    raise ValueError(f"bytes {offset}..{offset + length} of {ext.get('location')}")
                if key not in self.values:
                    dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
                    array = self.mapping[offset : offset + length].view(dtype).reshape(tuple(init.dims))
                    self.values[key] = ort.OrtValue.ortvalue_from_numpy(array)
            except (ValueError, TypeError, KeyError) as exc:
                raise ArtifactError(f"{graph_file}: initializer {init.name} does not fit {self.file} ({exc}); "
                                    "re-export the model") from exc
            options.add_initializer(init.name, self.values[key])
        if not prepack:
            options.add_session_config_entry("session.disable_prepacking", "1")
        if arena:
            share_cpu_arena(options)


def share_cpu_arena(options: ort.SessionOptions) -> None:
    """Let the session allocate its activations from the environment's CPU arena, registered once per process and
    shared by every session that asks (ONNX Runtime's environment is process-wide; registering it again keeps the
    first), instead of an arena of its own: sessions run one after another, so one arena serves them all (measured:
    half the activation memory)."""
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, None)
    options.add_session_config_entry("session.use_env_allocators", "1")
