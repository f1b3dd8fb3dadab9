"""What an export is asked to do: dtype, opset, length limit, the Seer statistics, and how to check the result.

A `--seer-config` JSON (e.g. a calibrated `seer.json`) may restrict the statistics the step-zero graph reports; only
its keys `stats_layers`, `abs_threshold` and `rel_threshold` matter here, the rest belongs to the runtime.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.checks import number_in
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.files import read_json
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.export.weights import INLINE_LIMIT_BYTES

if TYPE_CHECKING:
    from seer_deploy.seer.config import SeerConfig

DEFAULT_OPSET = 20
MIN_OPSET = 18  # the dynamo exporter's floor
MAX_ABS_THRESHOLD = 1e6
EXPORT_DTYPES: tuple[str, ...] = ("fp32", "fp16")


def check_opset(opset: int) -> None:
    """ConfigError unless the exporter and the installed onnx both support `opset`."""
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ConfigError(f"--opset {opset} is out of range: the exporter supports opsets {MIN_OPSET} to {newest}")


@dataclass(frozen=True)
class SeerStats:
    """Which layers the step-zero graph reports statistics for, and the 'near zero' thresholds.

    stats_layers None = every layer; () = the last layer (as SeerConfig reads it); negative indices count from the end.
    """

    stats_layers: tuple[int, ...] | None = None
    abs_threshold: float = 0.05
    rel_threshold: float = 0.05

    @classmethod
    def for_config(cls, seer: SeerConfig | None) -> SeerStats:
        """The statistics a Seer config reads (its layers and thresholds); the defaults when there is no config."""
        if seer is None:
            return cls()
        return cls(stats_layers=seer.stats_layers, abs_threshold=seer.abs_threshold, rel_threshold=seer.rel_threshold)

    def spec(self, n_layers: int) -> StatsSpec:
        if self.stats_layers is None:
            layers: tuple[int, ...] = tuple(range(n_layers))
        else:
            layers = tuple(i + n_layers if -n_layers <= i < 0 else i for i in self.stats_layers) or (n_layers - 1,)
        bad = [i for i in layers if not 0 <= i < n_layers]
        if bad:
            raise ConfigError(
                f"seer stats_layers {list(self.stats_layers or ())} name layers that a {n_layers}-layer model lacks; "
                f"use 0..{n_layers - 1} (or -1 for the last)"
            )
        if len(set(layers)) != len(layers):
            raise ConfigError(f"seer stats_layers {list(layers)} lists a layer twice")
        return StatsSpec(layers, self.abs_threshold, self.rel_threshold)


@dataclass(frozen=True)
class ExportOptions:
    dtype: str = "fp32"
    opset: int = DEFAULT_OPSET
    max_seq_len: int | None = None  # None = the model's max_seq_len
    seer: SeerStats = SeerStats()
    verify: bool = True
    force: bool = False
    kv_cache: bool = False  # also trace the block-wise KV cache graphs (refresh, window_step): --kv-cache
    check_resources: bool = True  # refuse up front when the disk or the memory cannot hold it (export.resources)
    inline_limit_bytes: int = INLINE_LIMIT_BYTES  # initializers at least this large go to the shared weights file
    quantization: Quantization | None = None  # weight-only int8 / int4 of the linear layers: --quantize

    def validate(self) -> None:
        if self.dtype == "bf16":
            raise ConfigError(
                "--dtype bf16 is not supported: ONNX Runtime's CPU provider has no bf16 kernels, so the export could "
                "neither be validated nor run on CPU; use --dtype fp16 (GPU) or fp32"
            )
        if self.dtype not in EXPORT_DTYPES:
            raise ConfigError(f"--dtype {self.dtype} is unknown; use one of {', '.join(EXPORT_DTYPES)}")
        check_opset(self.opset)
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ConfigError(f"--max-seq-len must be positive, got {self.max_seq_len}")
        if self.inline_limit_bytes < 0:
            raise ConfigError("inline_limit_bytes must be >= 0")
        if self.quantization is not None:
            self.quantization.check(self.opset)


def load_seer_stats(path: str | os.PathLike[str]) -> SeerStats:
    """Read stats_layers / abs_threshold / rel_threshold from a JSON file; other keys are ignored.

    An absent (or null) stats_layers means every layer; an empty list means the last layer (as SeerConfig reads it).
    """
    raw: dict[str, Any] = read_json(path, "--seer-config", fix="give a Seer config such as seer.json")
    kwargs: dict[str, Any] = {}
    for key, most in (("abs_threshold", MAX_ABS_THRESHOLD), ("rel_threshold", 1.0)):  # SeerConfig's ranges
        if key in raw:
            value = raw[key]
            if not number_in(value, 0.0, most, above_lo=True) or (key == "rel_threshold" and value == 1):
                raise ConfigError(f"--seer-config {path}: {key} must be a positive number below {most:g}, got "
                                  f"{value!r}")
            kwargs[key] = float(value)
    layers = raw.get("stats_layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in layers):
            raise ConfigError(f"--seer-config {path}: stats_layers must be a list of layer indices, got {layers!r}")
        kwargs["stats_layers"] = tuple(layers)
    return SeerStats(**kwargs)
