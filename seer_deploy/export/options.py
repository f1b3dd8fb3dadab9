"""What an export is asked to do: dtype, opset, length limit, the Seer statistics, and how to check the result.

The statistics the step-zero graph reports are those a Seer config reads (`--seer-config`; by default the
checkpoint's own `seer.json` where it ships one, else every layer at the default thresholds: `StatsSpec.from_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.errors import ConfigError
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
class ExportOptions:
    dtype: str = "fp32"
    opset: int = DEFAULT_OPSET
    max_seq_len: int | None = None  # None = the model's max_seq_len
    seer: SeerConfig | None = None  # whose statistics step zero computes; None: the checkpoint's seer.json, if any
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
