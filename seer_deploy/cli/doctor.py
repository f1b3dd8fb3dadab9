"""`seer-deploy doctor`: what this install can run (loop core, backends, providers, versions), so a slow or failing
run can be traced to a missing piece without reading code."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field

import click


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


def _torch() -> BackendStatus:
    try:
        import torch
    except ImportError as exc:
        return BackendStatus("torch", False, None, f"not importable ({exc})")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) or "CPU only"
    return BackendStatus("torch", True, torch.__version__, devices)


def _onnxruntime() -> BackendStatus:
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


def diagnose() -> Diagnosis:
    import numpy

    import seer_deploy
    from seer_deploy.models.checkpoint import resolve_checkpoint
    from seer_deploy.runtime.loopcore import c_core, core_name

    return Diagnosis(
        seer_deploy=seer_deploy.__version__,
        python=platform.python_version(),
        numpy=numpy.__version__,
        loop_core=core_name(),
        c_core_built=c_core() is not None,
        backends=[_torch(), _onnxruntime(), _tensorrt()],
        demo_checkpoint=(resolve_checkpoint("demo") / "model.safetensors").is_file(),
    )


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(as_json: bool) -> None:
    """Show the active loop core, the available backends (and ONNX Runtime providers) and versions."""
    d = diagnose()
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
