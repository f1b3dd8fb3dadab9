"""Which TensorRT builds and runs the engines: standard TensorRT (`import tensorrt`: data-centre GPUs, Jetson; it builds
on the GPU it targets) or TensorRT-RTX (`import tensorrt_rtx`: RTX PCs and workstations, DGX Spark; it builds without
a GPU for a set of compute capabilities and specialises kernels just in time on the user's GPU).

Both flavours expose the same Python API for everything seer-deploy calls, so one code path serves both: a
`TensorRTLibrary` carries the imported module, and the functions that call TensorRT bind it to a local name typed as
tensorrt-stubs' `tensorrt` module (`if TYPE_CHECKING: trt = trt_types else: trt = lib.module`), which is how
.ci/mypy-tensorrt.sh type-checks the RTX path too. The few calls only TensorRT-RTX has (target compute capabilities,
its runtime cache and built-in CUDA graphs) go through the small protocols at the end of this module, which the
stubs (standard TensorRT's) do not describe.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, cast

from seer_deploy.core.errors import ConfigError
from seer_deploy.engines.manifest import (
    LIBRARY_TITLES,
    RTX_TARGETS,
    TENSORRT_LIBRARIES,
    TensorRTLibraryName,
    architecture,
)

if TYPE_CHECKING:
    import tensorrt as trt_types

INSTALL_HINTS: dict[str, str] = {
    "tensorrt": "pip install tensorrt on a machine with an NVIDIA GPU (data centre, Jetson)",
    "tensorrt_rtx": "pip install tensorrt-rtx-cu13 (RTX PCs and workstations, DGX Spark; builds need no GPU)",
}
INSTALL_HINT = (
    "TensorRT is not installed: pip install tensorrt-rtx-cu13 (TensorRT-RTX, builds without a GPU) or tensorrt (on a "
    "GPU machine), or build for ONNX Runtime with --backend ort"
)


@dataclass(frozen=True)
class TensorRTLibrary:
    """One imported TensorRT flavour."""

    name: TensorRTLibraryName
    module: ModuleType

    @property
    def version(self) -> str:
        return str(self.module.__version__)

    @property
    def title(self) -> str:
        return f"{LIBRARY_TITLES[self.name]} {self.version}"

    @property
    def is_rtx(self) -> bool:
        return self.name == "tensorrt_rtx"

    def logger(self) -> trt_types.Logger:
        """The library's log on stderr: errors only, warnings too when debugging (SEER_DEPLOY_DEBUG=1)."""
        if TYPE_CHECKING:
            trt = trt_types
        else:
            trt = self.module
        return trt.Logger(trt.Logger.WARNING if os.environ.get("SEER_DEPLOY_DEBUG") else trt.Logger.ERROR)


def import_library(name: TensorRTLibraryName) -> TensorRTLibrary | None:
    """The flavour when its real bindings import (tensorrt-stubs alone installs an empty `tensorrt` package)."""
    try:
        module = importlib.import_module(name)
    except (ImportError, OSError):  # not installed, or its libraries do not load here
        return None
    return TensorRTLibrary(name, module) if hasattr(module, "Builder") else None


def installed_libraries() -> list[TensorRTLibrary]:
    """Every flavour that imports here, standard TensorRT first."""
    return [lib for lib in (import_library(name) for name in TENSORRT_LIBRARIES) if lib is not None]


def load_library(name: str | None = None) -> TensorRTLibrary:
    """The flavour `name` (None: the one installed, standard TensorRT first); ConfigError naming the install."""
    if name is None:
        found = installed_libraries()
        if not found:
            raise ConfigError(INSTALL_HINT)
        return found[0]
    if name not in TENSORRT_LIBRARIES:
        raise ConfigError(f"--trt-library '{name}' is unknown; use {' or '.join(TENSORRT_LIBRARIES)}")
    lib = import_library(cast(TensorRTLibraryName, name))  # one of TENSORRT_LIBRARIES: checked above
    if lib is None:
        raise ConfigError(f"{LIBRARY_TITLES[name]} is not installed: {INSTALL_HINTS[name]}")
    return lib


def tensorrt_available() -> bool:
    """True when either flavour's real bindings import."""
    return bool(installed_libraries())


def require_tensorrt() -> TensorRTLibrary:
    """The default flavour; ConfigError where none is installed."""
    return load_library()


def tensorrt_version() -> str:
    """The default flavour's name and version, e.g. 'TensorRT-RTX 1.7.1.116'."""
    return load_library().title


def gpu_facts(device: int = 0) -> tuple[str, str]:
    """(name, "major.minor" compute capability) of the CUDA device; ConfigError in one line where none is visible."""
    import torch  # here, not at the top: `seer-deploy doctor` asks which flavours import without loading torch

    if not torch.cuda.is_available():
        raise ConfigError("TensorRT engines run on a CUDA GPU and none is visible (check the driver and "
                          "CUDA_VISIBLE_DEVICES); build engines here with --trt-library tensorrt_rtx, run them on a GPU")
    major, minor = torch.cuda.get_device_capability(device)
    return torch.cuda.get_device_name(device), f"{major}.{minor}"


def parse_compute_capabilities(text: str) -> tuple[str, ...]:
    """'8.6,8.9' (or 'sm86,89') -> ('8.6', '8.9'), each checked against TensorRT-RTX's targets (the --compute-capability
    option); sorted, duplicates dropped."""
    found = []
    for part in (p.strip().lower().removeprefix("sm").removeprefix("_") for p in text.split(",")):
        if not part:
            continue
        value = part if "." in part else f"{part[:-1]}.{part[-1:]}"
        if value not in RTX_TARGETS:
            raise ConfigError(f"--compute-capability '{part}' is not a TensorRT-RTX target ({architecture(value)}); "
                              f"use some of {', '.join(RTX_TARGETS)}, or none for the portable set (Ampere and later)")
        found.append(value)
    if not found:
        raise ConfigError(f"--compute-capability '{text}' names no target; e.g. 8.9 or 8.6,12.0")
    return tuple(sorted(set(found), key=lambda v: tuple(int(n) for n in v.split("."))))


def rtx_target_enums(lib: TensorRTLibrary, capabilities: tuple[str, ...]) -> list[object]:
    """The library's ComputeCapability members for '8.9'-style values (SM89); ConfigError for one it lacks."""
    enum = getattr(lib.module, "ComputeCapability", None)
    if enum is None:
        raise ConfigError(f"{lib.title} has no ComputeCapability targets; --compute-capability is TensorRT-RTX's")
    members = []
    for value in capabilities:
        member = getattr(enum, "SM" + value.replace(".", ""), None)
        if member is None:
            raise ConfigError(f"--compute-capability {value}: {lib.title} has no such target; use some of "
                              f"{', '.join(RTX_TARGETS)}")
        members.append(member)
    return members


class RtxBuilderConfig(Protocol):
    """What TensorRT-RTX's IBuilderConfig adds: the target compute capabilities of an ahead-of-time build."""

    num_compute_capabilities: int

    def set_compute_capability(self, compute_capability: object, index: int) -> bool: ...


class RtxRuntimeCache(Protocol):
    """TensorRT-RTX's runtime cache: the kernels it compiled just in time on this GPU, saved between runs."""

    def serialize(self) -> memoryview: ...

    def deserialize(self, blob: bytes) -> bool: ...


class RtxRuntimeConfig(Protocol):
    """What TensorRT-RTX's IRuntimeConfig adds: its built-in CUDA graphs and the runtime cache."""

    cuda_graph_strategy: object

    def create_runtime_cache(self) -> RtxRuntimeCache: ...

    def set_runtime_cache(self, cache: RtxRuntimeCache) -> bool: ...
