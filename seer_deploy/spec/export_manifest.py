"""`manifest.json` of an export directory: what the graphs are, where they came from, and how to call them.

Everything a backend needs is written here so that nothing downstream guesses (input names, shapes, dtypes, the
sparsity rows, how sampling works). Loading validates the whole file and raises ArtifactError naming what is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seer_deploy.core.atomic import write_text_atomic
from seer_deploy.core.errors import ArtifactError, CheckpointError
from seer_deploy.models.config import ModelConfig
from seer_deploy.spec.artifact_json import read_json
from seer_deploy.spec.graphs import STEP_GRAPH_NAMES

FORMAT = "seer-deploy-export"
# 2: the graphs' `confidence` output is the log-probability of the chosen token (models.confidence); 1 returned
# the probability itself, which the runtime would now misread.
FORMAT_VERSION = 2
MANIFEST_FILE = "manifest.json"
DTYPES: tuple[str, ...] = ("fp32", "fp16")
LAYOUTS: tuple[str, ...] = ("llada", "llama")
SPECIAL_ID_NAMES: tuple[str, ...] = ("mask", "eos", "pad", "bos", "eot")


@dataclass(frozen=True)
class TensorSpec:
    """An input or output: ONNX element type name ('int64', 'float32') and shape (ints or symbolic dim names)."""

    dtype: str
    shape: list[int | str]

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphRecord:
    """What an export recorded about one graph file: its hash and its inputs and outputs as traced (spec.graphs
    declares what they must be)."""

    file: str
    sha256: str  # of the .onnx file (its external-data references included; the weights have their own hash)
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "sha256": self.sha256,
            "inputs": {k: v.to_dict() for k, v in self.inputs.items()},
            "outputs": {k: v.to_dict() for k, v in self.outputs.items()},
        }


@dataclass(frozen=True)
class ModelSpec:
    source: str
    layout: str
    fingerprint: str  # models.checkpoint.checkpoint_fingerprint of the checkpoint directory
    config: dict[str, Any]  # ModelConfig.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "layout": self.layout, "fingerprint": self.fingerprint, "config": self.config}


@dataclass(frozen=True)
class SeerSpec:
    """The statistics the step-zero graph reports: sparsity row r is (layer, stat_name) = sparsity_rows[r]."""

    stats_layers: list[int]
    stat_names: list[str]
    abs_threshold: float
    rel_threshold: float
    sparsity_rows: list[tuple[int, str]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stats_layers": list(self.stats_layers),
            "stat_names": list(self.stat_names),
            "abs_threshold": self.abs_threshold,
            "rel_threshold": self.rel_threshold,
            "sparsity_rows": [[layer, stat] for layer, stat in self.sparsity_rows],
        }


@dataclass(frozen=True)
class WeightsSpec:
    """The one external-data file both graphs read their initializers from."""

    file: str
    sha256: str
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class ExportManifest:
    model: ModelSpec
    special_ids: dict[str, int | None]
    dtype: str
    opset: int
    max_seq_len: int
    graphs: dict[str, GraphRecord]
    seer: SeerSpec
    sampling: dict[str, Any]
    versions: dict[str, str]
    weights: WeightsSpec
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def model_config(self) -> ModelConfig:
        return ModelConfig(**self.model.config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "model": self.model.to_dict(),
            "special_ids": dict(self.special_ids),
            "dtype": self.dtype,
            "opset": self.opset,
            "max_seq_len": self.max_seq_len,
            "graphs": {k: v.to_dict() for k, v in self.graphs.items()},
            "seer": self.seer.to_dict(),
            "sampling": self.sampling,
            "weights": self.weights.to_dict(),
            "versions": dict(self.versions),
            "extra": self.extra,
        }

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write manifest.json into `directory` through a temp file and a rename."""
        return write_text_atomic(Path(directory) / MANIFEST_FILE, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ExportManifest:
        """Read and validate DIR/manifest.json; ArtifactError if it is missing, foreign, newer or malformed."""
        root = Path(directory)
        path = root / MANIFEST_FILE
        if not root.is_dir():
            raise ArtifactError(f"export directory {root} does not exist; create it with `seer-deploy export CHECKPOINT --out {root}`")
        if not path.is_file():
            raise ArtifactError(
                f"{root} has no {MANIFEST_FILE}: it is not a seer-deploy export; create one with "
                f"`seer-deploy export CHECKPOINT --out {root}`"
            )
        return cls.from_dict(read_json(path, "re-export the model"), str(path))

    @classmethod
    def from_dict(cls, raw: Any, where: str = MANIFEST_FILE) -> ExportManifest:
        r = _Reader(where)
        if not isinstance(raw, dict):
            raise ArtifactError(f"{where}: expected a JSON object at the top level; re-export the model")
        fmt = raw.get("format")
        if fmt != FORMAT:
            raise ArtifactError(f"{where}: format is {fmt!r}, not {FORMAT!r}: not a seer-deploy export manifest")
        version = r.integer(raw, "format_version")
        if version > FORMAT_VERSION:
            raise ArtifactError(
                f"{where}: format_version {version} is newer than this seer-deploy understands ({FORMAT_VERSION}); "
                "upgrade seer-deploy or re-export the model with this version"
            )
        if version < 1:
            raise ArtifactError(f"{where}: format_version {version} is invalid; re-export the model")
        if version < FORMAT_VERSION:
            raise ArtifactError(
                f"{where}: format_version {version} was written by an older seer-deploy whose graphs return the "
                "confidence as a probability, not the log-probability this runtime ranks by; re-export the model"
            )
        model = r.obj(raw, "model")
        layout = r.string(model, "layout", "model.layout")
        if layout not in LAYOUTS:
            raise ArtifactError(f"{where}: model.layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        config = r.obj(model, "config", "model.config")
        try:
            ModelConfig(**config)
        except (TypeError, ValueError, CheckpointError) as exc:
            raise ArtifactError(f"{where}: model.config is not a valid model configuration ({exc})") from exc
        dtype = r.string(raw, "dtype")
        if dtype not in DTYPES:
            raise ArtifactError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        special = r.obj(raw, "special_ids")
        missing_ids = [k for k in SPECIAL_ID_NAMES if k not in special]
        if missing_ids:
            raise ArtifactError(f"{where}: special_ids lacks {', '.join(missing_ids)}; re-export the model")
        if not all(v is None or isinstance(v, int) for v in special.values()):
            raise ArtifactError(f"{where}: special_ids values must be integers or null")
        graphs_raw = r.obj(raw, "graphs")
        graphs = {name: r.graph(graphs_raw, name) for name in STEP_GRAPH_NAMES}
        seer = r.obj(raw, "seer")
        rows_raw = r.array(seer, "sparsity_rows", "seer.sparsity_rows")
        try:
            rows = [(int(layer), str(stat)) for layer, stat in rows_raw]
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: seer.sparsity_rows must be [layer, stat_name] pairs ({exc})") from exc
        weights = r.obj(raw, "weights")
        return cls(
            model=ModelSpec(
                source=r.string(model, "source", "model.source"),
                layout=layout,
                fingerprint=r.string(model, "fingerprint", "model.fingerprint"),
                config=config,
            ),
            special_ids=dict(special),
            dtype=dtype,
            opset=r.integer(raw, "opset"),
            max_seq_len=r.integer(raw, "max_seq_len"),
            graphs=graphs,
            seer=SeerSpec(
                stats_layers=[int(v) for v in r.array(seer, "stats_layers", "seer.stats_layers")],
                stat_names=[str(v) for v in r.array(seer, "stat_names", "seer.stat_names")],
                abs_threshold=r.number(seer, "abs_threshold", "seer.abs_threshold"),
                rel_threshold=r.number(seer, "rel_threshold", "seer.rel_threshold"),
                sparsity_rows=rows,
            ),
            sampling=r.obj(raw, "sampling"),
            versions={str(k): str(v) for k, v in r.obj(raw, "versions").items()},
            weights=WeightsSpec(
                file=r.string(weights, "file", "weights.file"),
                sha256=r.string(weights, "sha256", "weights.sha256"),
                bytes=r.integer(weights, "bytes", "weights.bytes"),
            ),
            format_version=version,
            extra=dict(raw.get("extra") or {}),
        )


class _Reader:
    """Typed field access that turns a missing or mistyped key into an ArtifactError naming it."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _get(self, obj: dict[str, Any], key: str, label: str | None, kind: type | tuple[type, ...], what: str) -> Any:
        label = label or key
        if key not in obj:
            raise ArtifactError(f"{self.where}: '{label}' is missing; the manifest is incomplete, re-export the model")
        value = obj[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ArtifactError(f"{self.where}: '{label}' must be {what}, got {value!r}; re-export the model")
        return value

    def obj(self, obj: dict[str, Any], key: str, label: str | None = None) -> dict[str, Any]:
        return self._get(obj, key, label, dict, "an object")  # type: ignore[no-any-return]

    def array(self, obj: dict[str, Any], key: str, label: str | None = None) -> list[Any]:
        return self._get(obj, key, label, list, "a list")  # type: ignore[no-any-return]

    def string(self, obj: dict[str, Any], key: str, label: str | None = None) -> str:
        return self._get(obj, key, label, str, "a string")  # type: ignore[no-any-return]

    def integer(self, obj: dict[str, Any], key: str, label: str | None = None) -> int:
        return self._get(obj, key, label, int, "an integer")  # type: ignore[no-any-return]

    def number(self, obj: dict[str, Any], key: str, label: str | None = None) -> float:
        return float(self._get(obj, key, label, (int, float), "a number"))

    def graph(self, graphs: dict[str, Any], name: str) -> GraphRecord:
        g = self.obj(graphs, name, f"graphs.{name}")

        def tensors(kind: str) -> dict[str, TensorSpec]:
            out: dict[str, TensorSpec] = {}
            for tname, spec in self.obj(g, kind, f"graphs.{name}.{kind}").items():
                label = f"graphs.{name}.{kind}.{tname}"
                if not isinstance(spec, dict):
                    raise ArtifactError(f"{self.where}: '{label}' must be an object with dtype and shape")
                out[tname] = TensorSpec(self.string(spec, "dtype", f"{label}.dtype"), self.array(spec, "shape", f"{label}.shape"))
            return out

        return GraphRecord(
            file=self.string(g, "file", f"graphs.{name}.file"),
            sha256=self.string(g, "sha256", f"graphs.{name}.sha256"),
            inputs=tensors("inputs"),
            outputs=tensors("outputs"),
        )
