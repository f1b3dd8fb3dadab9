"""What the numbers were measured on: CPU, cores, load, accelerators and library versions.

Speeds mean little without the machine, so every bench JSON carries this next to its measurements.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    cpu: str
    logical_cores: int
    usable_cores: int  # the cores this process may run on (affinity)
    load_average: tuple[float, float, float]  # 1, 5, 15 minutes, at the start of the run: other work on the box
    torch_threads: int
    platform: str
    python: str
    gpu: str | None
    versions: dict[str, str] = field(default_factory=dict)
    ort_providers: tuple[str, ...] = ()
    loop_core: str = ""


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what `platform` knows."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe_machine() -> Machine:
    import numpy
    import onnx
    import onnxruntime
    import torch

    import seer_deploy
    from seer_deploy.engines.tensorrt_engine import tensorrt_available, tensorrt_version
    from seer_deploy.runtime.loopcore import core_name

    versions = {
        "seer_deploy": seer_deploy.__version__,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": numpy.__version__,
    }
    if tensorrt_available():
        versions["tensorrt"] = tensorrt_version()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Machine(
        cpu=cpu_model(),
        logical_cores=os.cpu_count() or 1,
        usable_cores=usable,
        load_average=(round(load[0], 2), round(load[1], 2), round(load[2], 2)),
        torch_threads=torch.get_num_threads(),
        platform=platform.platform(),
        python=platform.python_version(),
        gpu=gpu,
        versions=versions,
        ort_providers=tuple(onnxruntime.get_available_providers()),
        loop_core=core_name(),
    )
