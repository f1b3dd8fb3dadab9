"""A graph's structure read without importing the `onnx` package: opening an export must not cost `import onnx`.

`import onnx` pulls in ml_dtypes and onnx's helpers (1.5-1.9 s on a 2-core machine, most of a run's time to first
step), while what a run reads of a graph (its external-data locations, its initializers' byte ranges) needs only
the protobuf classes onnx generates (`onnx/onnx_ml_pb2.py`, 0.1 s). Those are loaded from the installed onnx
package's file, without running its `__init__`; the classes are the ones `onnx.ModelProto` names (protobuf's
default pool holds one descriptor per message), so an `import onnx` later in the process sees the same types.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

# ONNX TensorProto.DataType -> numpy, for the element types an export's initializers have (INT4 / UINT4: two values
# per byte, no numpy view; see engines.ort_weights).
NUMPY_TYPES: dict[int, type[np.generic]] = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32,
                                            7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64}
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


def _generated_classes() -> ModuleType:
    """onnx's generated protobuf module (onnx_ml_pb2), loaded by file; `import onnx` where it is not found."""
    spec = importlib.util.find_spec("onnx")
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    source = origin.parent / "onnx_ml_pb2.py" if origin is not None else None
    if source is None or not source.is_file():
        import onnx

        return onnx  # the package exports the same classes
    module_spec = importlib.util.spec_from_file_location("onnx.onnx_ml_pb2", source)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def load_structure(graph_file: Path) -> Any:
    """The graph's ModelProto, external data not loaded (OSError, or google.protobuf's DecodeError)."""
    model = _generated_classes().ModelProto()
    model.ParseFromString(graph_file.read_bytes())
    return model


@dataclass(frozen=True)
class ExternalTensor:
    """One initializer whose bytes lie in an external file: where, and what they hold."""

    name: str
    location: str
    offset: int
    length: int  # -1: to the end of the file
    data_type: int  # TensorProto.DataType
    dims: tuple[int, ...]


def external_initializers(graph_file: Path, model: Any = None) -> list[ExternalTensor]:
    """The main graph's initializers held in external files (ValueError on a malformed offset or length)."""
    model = model if model is not None else load_structure(graph_file)
    found = []
    for init in model.graph.initializer:
        if init.data_location != EXTERNAL:
            continue
        ext = {e.key: e.value for e in init.external_data}
        found.append(ExternalTensor(init.name, ext.get("location", ""), int(ext.get("offset") or 0),
                                    int(ext.get("length") or -1), init.data_type, tuple(init.dims)))
    return found
