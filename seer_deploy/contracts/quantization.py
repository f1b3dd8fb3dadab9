"""How an export's weights were quantized (`export --quantize`): the scheme, the block size, the graph form, which
projections kept full precision. One record, written into the manifest's weights section and read by every part that
must know: the exporter (what to rewrite), the check (which tolerance), the builders (what a backend can run).

Weight-only and symmetric: each block of `block_size` consecutive input rows of a projection's column shares one scale
(in the export's dtype); activations stay in that dtype. Two forms of the same numbers:
  * "nbits": ONNX Runtime's MatMulNBits (com.microsoft), packed by its own quantizer; fast on CPU and CUDA.
  * "qdq": a blocked DequantizeLinear (opset 21, INT4 / INT8 weights) before a standard MatMul: what TensorRT (and
    TensorRT-RTX) read as a weight-only quantized GEMM; ONNX Runtime runs it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.fields import FieldReader
from seer_deploy.models.families.config import ModelConfig

SCHEMES: dict[str, int] = {"int8": 8, "int4": 4}  # scheme -> bits per weight
FORMATS: tuple[str, ...] = ("nbits", "qdq")
BLOCK_SIZES: tuple[int, ...] = (16, 32, 64, 128, 256)  # MatMulNBits takes powers of two from 16
DEFAULT_BLOCK_SIZE = 32  # llama.cpp's q4_0 / q8_0 block: per-weight error 0.086 (int4) and 0.005 (int8) measured
QDQ_MIN_OPSET = 21  # blocked DequantizeLinear and the INT4 type
ACCURACY_LEVEL = 4  # MatMulNBits computes with int8 activations: the fast CPU path (1.8x faster than level 0 at int8)


@dataclass(frozen=True)
class Quantization:
    """Weight-only quantization of the language model's linear layers (attention and MLP projections; the LM head
    too unless `keep_head`). The embedding, the norms and a vision tower keep the export's dtype."""

    scheme: str
    block_size: int = DEFAULT_BLOCK_SIZE
    format: str = "nbits"
    keep_head: bool = False

    @property
    def bits(self) -> int:
        return SCHEMES[self.scheme]

    def check(self, opset: int) -> None:
        """ConfigError naming a bad setting (before any work)."""
        if self.scheme not in SCHEMES:
            raise ConfigError(f"--quantize {self.scheme} is unknown; use one of {', '.join(SCHEMES)}")
        if self.block_size not in BLOCK_SIZES:
            raise ConfigError(f"--block-size {self.block_size} is not supported; use one of "
                              f"{', '.join(map(str, BLOCK_SIZES))} (MatMulNBits takes powers of two from 16)")
        if self.format not in FORMATS:
            raise ConfigError(f"--quant-format {self.format} is unknown; use one of {', '.join(FORMATS)}")
        if self.format == "qdq" and opset < QDQ_MIN_OPSET:
            raise ConfigError(f"--quant-format qdq needs --opset {QDQ_MIN_OPSET} or newer (blocked DequantizeLinear "
                              f"and INT4 weights), got --opset {opset}")

    def check_widths(self, cfg: ModelConfig) -> None:
        """ConfigError unless the block size divides every width a quantized projection reads (its input rows)."""
        widths = {"d_model": cfg.d_model, "the MLP's hidden size": cfg.mlp_hidden}
        bad = [f"{name} {width}" for name, width in widths.items() if width % self.block_size]
        if bad:
            fits = [b for b in BLOCK_SIZES if all(w % b == 0 for w in widths.values())]
            raise ConfigError(f"--block-size {self.block_size} does not divide {', '.join(bad)} of this model; use "
                              + (f"one of {', '.join(map(str, fits))}" if fits else "no quantization"))

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "bits": self.bits, "block_size": self.block_size, "format": self.format,
                "symmetric": True, "keep_head": self.keep_head}

    @classmethod
    def read(cls, raw: dict[str, Any], reader: FieldReader, label: str) -> Quantization:
        """The record back from a manifest; ArtifactError naming a bad field."""
        quant = cls(scheme=reader.string(raw, "scheme", f"{label}.scheme"),
                    block_size=reader.integer(raw, "block_size", f"{label}.block_size", lo=1, hi=1 << 20),
                    format=reader.string(raw, "format", f"{label}.format"),
                    keep_head=bool(raw.get("keep_head", False)))
        if quant.scheme not in SCHEMES or quant.format not in FORMATS or quant.block_size not in BLOCK_SIZES:
            raise reader.refuse(f"{label} (scheme {quant.scheme!r}, block_size {quant.block_size}, format "
                                f"{quant.format!r}) is not a quantization this seer-deploy writes")
        return quant

    def describe(self) -> str:
        """'int4 (blocks of 32, MatMulNBits)': for messages and reports."""
        form = "MatMulNBits" if self.format == "nbits" else "DequantizeLinear + MatMul"
        return f"{self.scheme} (blocks of {self.block_size}, {form}{', LM head kept' if self.keep_head else ''})"
