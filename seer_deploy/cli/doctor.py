"""`seer-deploy doctor`: what this install can run (loop core, backends, providers, versions), so a slow or failing
run can be traced to a missing piece without reading code."""

from __future__ import annotations

import importlib.util
import json
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import click

from seer_deploy.cli.verbs import summary


@dataclass(frozen=True)
class BackendStatus:
    name: str
    available: bool
    version: str | None
    detail: str  # providers, devices, or why it is missing


@dataclass(frozen=True)
class Diagnosis:
    seer_deploy: str
    python: str
    numpy: str
    loop_core: str  # 'c' or 'python': the one the runtime loop uses now
    c_core_built: bool
    backends: list[BackendStatus] = field(default_factory=list)
    demo_checkpoint: bool = False


# ONNX Runtime's execution providers, by the library each one ships as inside the package (the CPU one is built in).
ORT_PROVIDER_LIBRARIES = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider",
                          "rocm": "ROCMExecutionProvider", "migraphx": "MIGraphXExecutionProvider",
                          "openvino": "OpenVINOExecutionProvider", "dnnl": "DnnlExecutionProvider",
                          "vitisai": "VitisAIExecutionProvider", "qnn": "QNNExecutionProvider"}


def _installed(module: str) -> tuple[str, Path] | None:
    """(version, package folder) of an installed top-level package, read from its metadata without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    version = "unknown"
    for distribution in metadata.packages_distributions().get(module, []):
        version = metadata.version(distribution)
        break
    return version, Path(next(iter(spec.submodule_search_locations)))


def driver_gpus(root: Path = Path("/proc/driver/nvidia/gpus")) -> list[str]:
    """The GPUs the NVIDIA driver reports on Linux, read from its files (no CUDA library is loaded)."""
    names = []
    for info in sorted(root.glob("*/information")):
        try:
            lines = info.read_text(errors="replace").splitlines()
        except OSError:
            continue
        names += [line.split(":", 1)[1].strip() for line in lines if line.startswith("Model:")]
    return names


def _torch(probe: bool) -> BackendStatus:
    if not probe:
        found = _installed("torch")
        if found is None:
            return BackendStatus("torch", False, None, "not installed; pip install torch")
        gpus = driver_gpus()
        seen = f"NVIDIA driver: {', '.join(gpus)}" if gpus else "no NVIDIA GPU seen by the driver"
        return BackendStatus("torch", True, found[0], f"{seen} (--probe asks torch)")
    try:
        import torch
    except ImportError as exc:
        return BackendStatus("torch", False, None, f"not importable ({exc})")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = ", ".join(torch.cuda.get_device_name(i) for i in range(count)) or "CPU only"
    return BackendStatus("torch", True, torch.__version__, devices)


def _onnxruntime(probe: bool) -> BackendStatus:
    if not probe:
        found = _installed("onnxruntime")
        if found is None:
            return BackendStatus("onnxruntime", False, None, "not installed; pip install onnxruntime")
        version, folder = found
        shipped = {lib.name.split(".")[0].rsplit("_", 1)[-1] for lib in (folder / "capi").glob("*_providers_*")}
        providers = [name for key, name in ORT_PROVIDER_LIBRARIES.items() if key in shipped]
        return BackendStatus("onnxruntime", True, version,
                             "providers: " + ", ".join([*providers, "CPUExecutionProvider"]) + " (--probe loads it)")
    try:
        import onnxruntime
    except ImportError as exc:
        return BackendStatus("onnxruntime", False, None, f"not importable ({exc}); pip install onnxruntime")
    return BackendStatus("onnxruntime", True, onnxruntime.__version__,
                         "providers: " + ", ".join(onnxruntime.get_available_providers()))


def _tensorrt() -> BackendStatus:
    """Either TensorRT flavour (the row is available when one is), each one's state and what it builds and runs on."""
    from seer_deploy.engines.manifest import LIBRARY_TITLES, TENSORRT_LIBRARIES
    from seer_deploy.engines.tensorrt_library import INSTALL_HINT, INSTALL_HINTS, import_library, installed_libraries

    what = {"tensorrt": "builds and runs on the GPU it targets (data centre, Jetson)",
            "tensorrt_rtx": "builds here without a GPU, runs on RTX-class GPUs (SM 7.5-12.1, no Hopper)"}
    parts = []
    for name in TENSORRT_LIBRARIES:
        lib = import_library(name)
        state = f"{lib.version}: {what[name]}" if lib else f"missing ({INSTALL_HINTS[name]})"
        parts.append(f"{LIBRARY_TITLES[name]} {state}")
    found = installed_libraries()
    if not found:
        return BackendStatus("tensorrt", False, None, INSTALL_HINT)
    return BackendStatus("tensorrt", True, found[0].title, "; ".join(parts))


def diagnose(probe: bool = False) -> Diagnosis:
    """What this install can run. Without `probe` torch and ONNX Runtime are not imported (their versions and
    providers come from their installed files), so the answer is quick; with it they are loaded and asked."""
    import numpy

    import seer_deploy
    from seer_deploy.models.checkpoints.checkpoint_files import resolve_checkpoint
    from seer_deploy.runtime.loopcore import c_core, core_name

    return Diagnosis(
        seer_deploy=seer_deploy.__version__,
        python=platform.python_version(),
        numpy=numpy.__version__,
        loop_core=core_name(),
        c_core_built=c_core() is not None,
        backends=[_torch(probe), _onnxruntime(probe), _tensorrt()],
        demo_checkpoint=(resolve_checkpoint("demo") / "model.safetensors").is_file(),
    )


@click.command("doctor", short_help=summary("doctor"))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--probe", is_flag=True, help="Load torch and ONNX Runtime and ask them (GPUs, providers): slower, exact.")
def command(as_json: bool, probe: bool) -> None:
    """Show the active loop core, the available backends (and ONNX Runtime providers) and versions."""
    d = diagnose(probe)
    if as_json:
        click.echo(json.dumps(asdict(d)))
        return
    click.echo(f"seer-deploy {d.seer_deploy} (Python {d.python}, numpy {d.numpy})")
    core_note = "C extension" if d.loop_core == "c" else (
        "numpy twin; the C extension is built but SEER_DEPLOY_PURE_PYTHON=1 disables it" if d.c_core_built
        else "numpy twin; the C extension was not built (reinstall with a C compiler for faster host steps)")
    click.echo(f"loop core: {d.loop_core} ({core_note})")
    for b in d.backends:
        state = f"{b.version}" if b.available else "missing"
        click.echo(f"  {b.name:12s} {state:14s} {b.detail}")
    click.echo(f"demo checkpoint: {'present' if d.demo_checkpoint else 'missing (train it: scripts/train_demo.py)'}")
