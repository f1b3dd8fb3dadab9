"""What an export will need, from the checkpoint's headers alone, checked against the machine before any work: the
disk its files take and the memory its largest stage holds (`--no-resource-check` proceeds anyway).

The memory figure follows the streamed export's stages (export.exporter), each holding at most:
  * torch reference (with verification): the embedding and LM head in float32 (and in the export's dtype) for the
    whole computation, one layer in the same dtypes while it runs, and the tensor being read;
  * writing the weights file: one tensor as stored, converted and transposed;
  * ONNX Runtime validation (with verification): the weights file (memory-mapped, read in place), the largest weight in
    float32 (a float16 export on the CPU casts each weight as its MatMul runs), activations;
plus the libraries. Measured against it: BENCHMARKS.md, "Export at scale".
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.errors import ConfigError
from seer_deploy.models.checkpoints.weight_sources import WeightSource

GiB = 2**30
BASELINE_BYTES = 1 * GiB  # torch, onnx, onnxruntime and the traced graphs (measured: ~1 GiB resident while tracing)
ACTIVATION_BYTES = GiB // 2  # the validation probes' activations (tens of positions; logits over the vocabulary)
DISK_MARGIN = 1.02  # alignment padding, the graphs, the manifest
TOP_LEVEL = ("embed.", "final_norm.", "lm_head.")


@dataclass(frozen=True)
class Footprint:
    """The bytes an export writes and the most it holds in memory at once (estimates, from the tensor shapes)."""

    disk: int
    memory: int
    weights: int  # the weights file alone, in the export's dtype (its projections quantized with --quantize)


def footprint(sources: Mapping[str, WeightSource], dtype: torch.dtype, verify: bool,
              quantization: Quantization | None = None) -> Footprint:
    size = torch.empty((), dtype=dtype).element_size()
    numel = {name: math.prod(source.shape) for name, source in sources.items()}
    weights = sum(_written(name, source.shape, size, quantization) for name, source in sources.items())
    largest = max(numel.values(), default=0)
    stored = max((source.nbytes for source in sources.values()), default=0)
    writing = stored + 2 * largest * (size if quantization is None else 4)  # quantized from float32
    stages = [writing]
    if verify:
        per_param = 4 + (size if size != 4 else 0)  # float32, and the export's dtype beside it
        top = sum(n for name, n in numel.items() if name.startswith(TOP_LEVEL)) * per_param
        layers: dict[str, int] = {}
        for name, n in numel.items():
            if name.startswith("layers."):
                layer = name.split(".", 2)[1]
                layers[layer] = layers.get(layer, 0) + n
        stages.append(top + max(layers.values(), default=0) * per_param + stored + ACTIVATION_BYTES)
        stages.append(weights + largest * 4 + ACTIVATION_BYTES)
    return Footprint(disk=int(weights * DISK_MARGIN), memory=BASELINE_BYTES + max(stages), weights=weights)


def _written(name: str, shape: tuple[int, ...], size: int, quantization: Quantization | None) -> int:
    """A tensor's bytes in the weights file: a layer's projection (and the LM head, unless kept) quantized to
    bits/8 per weight plus one scale per block; everything else in the export's dtype."""
    n = math.prod(shape)
    projection = name.startswith("layers.") or (name.startswith("lm_head.") and not quantization.keep_head) \
        if quantization is not None else False
    if quantization is None or len(shape) != 2 or not projection:
        return n * size
    return n * quantization.bits // 8 + n // quantization.block_size * size


def available_memory() -> int | None:
    """What the system can give a new process without swapping (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_disk(dest: Path) -> int:
    """Free bytes on the filesystem that will hold `dest` (its nearest existing parent's)."""
    probe = dest
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_resources(need: Footprint, dest: Path, verify: bool) -> None:
    """ConfigError with the numbers when the disk or the memory cannot hold the export."""
    free = free_disk(dest)
    if need.disk > free:
        raise ConfigError(f"not enough free disk for this export: it writes {need.disk / GiB:.1f} GiB beside {dest}, "
                          f"where {free / GiB:.1f} GiB are free; free some space or choose another --out "
                          "(--no-resource-check tries anyway)")
    memory = available_memory()
    if memory is not None and need.memory > memory:
        fix = "--no-verify skips the torch and ONNX Runtime comparison, the largest part; " if verify else ""
        raise ConfigError(f"this export needs about {need.memory / GiB:.1f} GiB of memory at its peak and "
                          f"{memory / GiB:.1f} GiB are available; {fix}close other programs, "
                          "or use a larger machine (--no-resource-check tries anyway)")
