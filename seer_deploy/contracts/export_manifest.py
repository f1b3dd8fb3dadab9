"""`manifest.json` of an export directory: what the graphs are, where they came from, and how to call them.

Everything a backend needs is written here so that nothing downstream guesses (input names, shapes, dtypes, the
sparsity rows, how sampling works); the sections' records and their field checks are in contracts.manifest_sections.
Loading validates the whole file and raises ArtifactError naming what is wrong:
types, values a hostile file could use to crash a later step (token ids past the vocabulary, layers the model lacks),
and the files it names, which must lie inside the export directory (symlinks resolved) before anything opens them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seer_deploy.contracts.graphs import CACHE_GRAPH_NAMES, KV, SPARSITY, STEP
from seer_deploy.contracts.manifest_sections import (
    MAX_DIM,
    GraphRecord,
    ModelSpec,
    SectionReader,
    WeightsSpec,
)
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.atomic import write_text_atomic
from seer_deploy.core.errors import ArtifactError, CheckpointError
from seer_deploy.core.files import confined, read_json
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.families.config import ModelConfig

FORMAT = "seer-deploy-export"
# 3: one step graph serves step zero, the steps and the cache refresh (it takes `candidates` and `with_stats`); 2 had
# separate step0 / refresh graphs. 2: the graphs' `confidence` output is the log-probability of the chosen token
# (models.networks.confidence); 1 returned the probability itself, which the runtime would now misread.
FORMAT_VERSION = 3
MANIFEST_FILE = "manifest.json"
DTYPES: tuple[str, ...] = ("fp32", "fp16")
LAYOUTS: tuple[str, ...] = ("llada", "llama")
MAX_OPSET = 1000  # far above any ONNX opset; bounds a hostile value


@dataclass(frozen=True)
class ExportManifest:
    model: ModelSpec
    special_ids: dict[str, int | None]
    dtype: str
    opset: int
    max_seq_len: int
    graphs: dict[str, GraphRecord]
    seer: StatsSpec  # the statistics step zero computes
    sampling: dict[str, Any]
    versions: dict[str, str]
    weights: WeightsSpec
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def model_config(self) -> ModelConfig:
        return ModelConfig(**self.model.config)

    @property
    def has_cache(self) -> bool:
        """Whether the export has the block-wise KV cache (export --kv-cache: the window graph, and the step graph's
        kv output)."""
        return all(name in self.graphs for name in CACHE_GRAPH_NAMES)

    @property
    def verified(self) -> bool | None:
        """Whether the export passed its check against torch (None: exported with --no-verify)."""
        verdict = self.extra.get("validation")
        return bool(verdict.get("verified")) if isinstance(verdict, dict) else None

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
            "seer": self.seer.to_manifest(),
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
        """Read and validate DIR/manifest.json; ArtifactError if it is missing, foreign, newer or malformed, or if a
        file it names lies outside DIR."""
        root = Path(directory)
        path = root / MANIFEST_FILE
        if not root.is_dir():
            raise ArtifactError(f"export directory {root} does not exist; create it with `seer-deploy export CHECKPOINT --out {root}`")
        if not path.is_file():
            raise ArtifactError(
                f"{root} has no {MANIFEST_FILE}: it is not a seer-deploy export; create one with "
                f"`seer-deploy export CHECKPOINT --out {root}`"
            )
        raw = read_json(path, "export manifest", fix="re-export the model", error=ArtifactError)
        manifest = cls.from_dict(raw, str(path))
        for label, name in manifest.named_files().items():
            confined(root, name, f"{path}: {label}", error=ArtifactError)
        return manifest

    def named_files(self) -> dict[str, str]:
        """Every file the manifest names, by the key that names it ('graphs.step.file': 'step.onnx')."""
        files = {f"graphs.{name}.file": graph.file for name, graph in self.graphs.items()}
        section = self.extra.get(MULTIMODAL_KEY)
        if isinstance(section, dict):  # from_dict checked its shape
            files["extra.multimodal.vision.file"] = section["vision"]["file"]
        return files | {"weights.file": self.weights.file}

    @classmethod
    def from_dict(cls, raw: Any, where: str = MANIFEST_FILE) -> ExportManifest:
        r = SectionReader(where)
        if not isinstance(raw, dict):
            raise ArtifactError(f"{where}: expected a JSON object at the top level; re-export the model")
        fmt = raw.get("format")
        if fmt != FORMAT:
            raise ArtifactError(f"{where}: format is {fmt!r}, not {FORMAT!r}: not a seer-deploy export manifest")
        version = _format_version(r, raw)
        model = r.obj(raw, "model")
        layout = r.string(model, "layout", "model.layout")
        if layout not in LAYOUTS:
            raise ArtifactError(f"{where}: model.layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        config = r.obj(model, "config", "model.config")
        try:
            cfg = ModelConfig(**config)
        except (TypeError, ValueError, CheckpointError) as exc:
            raise ArtifactError(f"{where}: model.config is not a valid model configuration ({exc})") from exc
        dtype = r.string(raw, "dtype")
        if dtype not in DTYPES:
            raise ArtifactError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        weights = r.obj(raw, "weights")
        extra = raw.get("extra")
        if extra is not None and not isinstance(extra, dict):
            raise ArtifactError(f"{where}: 'extra' must be an object, got {extra!r}; re-export the model")
        if isinstance(extra, dict) and MULTIMODAL_KEY in extra:
            r.multimodal(extra[MULTIMODAL_KEY], cfg)
        manifest = cls(
            model=ModelSpec(
                source=r.string(model, "source", "model.source"),
                layout=layout,
                fingerprint=r.string(model, "fingerprint", "model.fingerprint"),
                config=config,
            ),
            special_ids=r.special_ids(r.obj(raw, "special_ids"), cfg.vocab_size),
            dtype=dtype,
            opset=r.integer(raw, "opset", lo=1, hi=MAX_OPSET),
            max_seq_len=r.integer(raw, "max_seq_len", lo=2, hi=cfg.max_seq_len),
            graphs={name: r.graph(r.obj(raw, "graphs"), name) for name in r.graph_names(r.obj(raw, "graphs"))},
            seer=r.seer(r.obj(raw, "seer"), cfg.n_layers),
            sampling=r.obj(raw, "sampling"),
            versions={str(k): str(v) for k, v in r.obj(raw, "versions").items()},
            weights=WeightsSpec(
                file=r.string(weights, "file", "weights.file"),
                sha256=r.string(weights, "sha256", "weights.sha256"),
                bytes=r.integer(weights, "bytes", "weights.bytes", lo=0, hi=MAX_DIM),
                quantization=(Quantization.read(r.obj(weights, "quantization", "weights.quantization"), r,
                                                "weights.quantization") if "quantization" in weights else None),
            ),
            format_version=version,
            extra=dict(extra or {}),
        )
        _check_sparsity_rows(manifest, where)
        _check_cache(manifest, where)
        return manifest


def _format_version(r: SectionReader, raw: dict[str, Any]) -> int:
    """The manifest's format_version, when this seer-deploy reads it."""
    version = r.integer(raw, "format_version")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{r.where}: format_version {version} is newer than this seer-deploy understands ({FORMAT_VERSION}); "
            "upgrade seer-deploy or re-export the model with this version"
        )
    if version < 1:
        raise ArtifactError(f"{r.where}: format_version {version} is invalid; re-export the model")
    if version < FORMAT_VERSION:
        why = ("graphs return the confidence as a probability, not the log-probability this runtime ranks by"
               if version < 2 else "step0 / step / refresh graphs are three graphs where this runtime runs one")
        raise ArtifactError(f"{r.where}: format_version {version} was written by an older seer-deploy whose {why}; "
                            "re-export the model")
    return version


def _check_cache(manifest: ExportManifest, where: str) -> None:
    """The window graph reads the keys and values the step graph returns: a cache export's step graph has kv."""
    if manifest.has_cache and KV.name not in manifest.graphs[STEP.name].outputs:
        raise ArtifactError(f"{where}: the export has the window graph but its step graph returns no '{KV.name}'; "
                            "re-export with --kv-cache")


def _check_sparsity_rows(manifest: ExportManifest, where: str) -> None:
    """The step graph reports one sparsity row per seer.sparsity_rows entry (where its record fixes the count)."""
    recorded = manifest.graphs[STEP.name].outputs.get(SPARSITY.name)
    rows = recorded.shape[1] if recorded is not None and len(recorded.shape) == 3 else None
    if isinstance(rows, int) and rows != len(manifest.seer.sparsity_rows):
        raise ArtifactError(
            f"{where}: the step graph reports {rows} sparsity rows, seer.sparsity_rows lists "
            f"{len(manifest.seer.sparsity_rows)}; re-export the model"
        )
