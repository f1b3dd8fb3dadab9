"""`manifest.json` of an export directory: what the graphs are, where they came from, and how to call them.

Everything a backend needs is written here so that nothing downstream guesses (input names, shapes, dtypes, the
sparsity rows, how sampling works). Loading validates the whole file and raises ArtifactError naming what is wrong:
types, values a hostile file could use to crash a later step (token ids past the vocabulary, layers the model lacks),
and the files it names, which must lie inside the export directory (symlinks resolved) before anything opens them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seer_deploy.core.atomic import write_text_atomic
from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.errors import ArtifactError, CheckpointError, SeerDeployError
from seer_deploy.core.files import confined, read_json
from seer_deploy.models.config import ModelConfig
from seer_deploy.models.image import ImageConfig
from seer_deploy.spec.graphs import CACHE_GRAPH_NAMES, KV, SPARSITY, STEP, STEP_GRAPH_NAMES
from seer_deploy.spec.multimodal import MULTIMODAL_KEY

FORMAT = "seer-deploy-export"
# 3: one step graph serves step zero, the steps and the cache refresh (it takes `candidates` and `with_stats`); 2 had
# separate step0 / refresh graphs. 2: the graphs' `confidence` output is the log-probability of the chosen token
# (models.confidence); 1 returned the probability itself, which the runtime would now misread.
FORMAT_VERSION = 3
MANIFEST_FILE = "manifest.json"
DTYPES: tuple[str, ...] = ("fp32", "fp16")
LAYOUTS: tuple[str, ...] = ("llada", "llama")
SPECIAL_ID_NAMES: tuple[str, ...] = ("mask", "eos", "pad", "bos", "eot")
MAX_OPSET = 1000  # far above any ONNX opset; bounds a hostile value
MAX_DIM = 1 << 40  # a recorded dimension or byte count past this is not a real export's


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
        r = _Reader(where)
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
            ),
            format_version=version,
            extra=dict(extra or {}),
        )
        _check_sparsity_rows(manifest, where)
        _check_cache(manifest, where)
        return manifest


def _format_version(r: _Reader, raw: dict[str, Any]) -> int:
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

    def integer(self, obj: dict[str, Any], key: str, label: str | None = None, *, lo: int = -(1 << 62),
                hi: int = 1 << 62) -> int:
        value: int = self._get(obj, key, label, int, "an integer")
        if not int_in(value, lo, hi):
            raise ArtifactError(f"{self.where}: '{label or key}' is {value}; it must lie in {lo}..{hi}: re-export the "
                                "model")
        return value

    def number(self, obj: dict[str, Any], key: str, label: str | None = None) -> float:
        """A finite number above 0 (every number a manifest holds is a threshold)."""
        value = self._get(obj, key, label, (int, float), "a number")
        if not number_in(value, 0.0, math.inf, above_lo=True):
            raise ArtifactError(f"{self.where}: '{label or key}' is {value!r}; it must be a number above 0")
        return float(value)

    def special_ids(self, special: dict[str, Any], vocab_size: int) -> dict[str, int | None]:
        """Every special token id present, null or a token of the vocabulary."""
        missing = [k for k in SPECIAL_ID_NAMES if k not in special]
        if missing:
            raise ArtifactError(f"{self.where}: special_ids lacks {', '.join(missing)}; re-export the model")
        for name, value in special.items():
            if value is not None and not int_in(value, 0, vocab_size - 1):
                raise ArtifactError(
                    f"{self.where}: special_ids.{name} is {value!r}; it must be null or a token id in "
                    f"0..{vocab_size - 1} (model.config.vocab_size {vocab_size}); re-export the model"
                )
        return dict(special)

    def seer(self, seer: dict[str, Any], n_layers: int) -> SeerSpec:
        """The statistics section: layers the model has, and [layer, stat_name] rows over them."""
        layers = self.array(seer, "stats_layers", "seer.stats_layers")
        names = self.array(seer, "stat_names", "seer.stat_names")
        rows = self.array(seer, "sparsity_rows", "seer.sparsity_rows")
        if not all(int_in(v, 0, n_layers - 1) for v in layers):
            raise ArtifactError(f"{self.where}: seer.stats_layers {layers} must be layers of the {n_layers}-layer "
                                "model; re-export the model")
        if not all(isinstance(v, str) for v in names):
            raise ArtifactError(f"{self.where}: seer.stat_names must be a list of names; re-export the model")
        if not all(isinstance(row, list) and len(row) == 2 and int_in(row[0], 0, n_layers - 1) and row[1] in names
                   for row in rows):
            raise ArtifactError(f"{self.where}: seer.sparsity_rows must be [layer, stat_name] pairs over the model's "
                                f"{n_layers} layers and seer.stat_names; re-export the model")
        return SeerSpec(
            stats_layers=list(layers),
            stat_names=list(names),
            abs_threshold=self.number(seer, "abs_threshold", "seer.abs_threshold"),
            rel_threshold=self.number(seer, "rel_threshold", "seer.rel_threshold"),
            sparsity_rows=[(layer, stat) for layer, stat in rows],
        )

    def multimodal(self, section: Any, cfg: ModelConfig) -> None:
        """extra.multimodal: the vision graph's record, image ids above the vocabulary's rows, the image settings."""
        label = f"extra.{MULTIMODAL_KEY}"
        if not isinstance(section, dict):
            raise ArtifactError(f"{self.where}: '{label}' must be an object; re-export the model")
        self.graph(section, "vision", f"{label}.vision")
        self.string(section, "image_table_input", f"{label}.image_table_input")
        self.integer(section, "image_id_base", f"{label}.image_id_base", lo=cfg.n_embed_rows, hi=cfg.n_embed_rows)
        vision = self.obj(section, "vision_config", f"{label}.vision_config")
        self.integer(vision, "tokens_per_image", f"{label}.vision_config.tokens_per_image", lo=1,
                     hi=cfg.max_seq_len - 1)
        self.integer(vision, "image_token_index", f"{label}.vision_config.image_token_index", lo=-(1 << 31), hi=-1)
        image = self.obj(vision, "image", f"{label}.vision_config.image")
        try:
            ImageConfig(self.integer(image, "image_size", f"{label}.image.image_size"),
                        tuple(self.array(image, "mean", f"{label}.image.mean")),
                        tuple(self.array(image, "std", f"{label}.image.std")),
                        self.string(image, "aspect", f"{label}.image.aspect"))
        except SeerDeployError as exc:
            raise ArtifactError(f"{self.where}: {label}.vision_config.image: {exc}") from exc

    def graph_names(self, graphs: dict[str, Any]) -> tuple[str, ...]:
        """The step graphs, and the cache graphs when the export has them (both or neither)."""
        cache = [name for name in CACHE_GRAPH_NAMES if name in graphs]
        if cache and len(cache) != len(CACHE_GRAPH_NAMES):
            raise ArtifactError(f"{self.where}: 'graphs' has {cache[0]} without the other cache graph "
                                f"({', '.join(CACHE_GRAPH_NAMES)}); re-export with --kv-cache")
        return STEP_GRAPH_NAMES + (CACHE_GRAPH_NAMES if cache else ())

    def graph(self, graphs: dict[str, Any], name: str, label: str | None = None) -> GraphRecord:
        label = label or f"graphs.{name}"
        g = self.obj(graphs, name, label)
        return GraphRecord(
            file=self.string(g, "file", f"{label}.file"),
            sha256=self.string(g, "sha256", f"{label}.sha256"),
            inputs=self.tensors(g, f"{label}.inputs", "inputs"),
            outputs=self.tensors(g, f"{label}.outputs", "outputs"),
        )

    def tensors(self, graph: dict[str, Any], label: str, kind: str) -> dict[str, TensorSpec]:
        """A graph's inputs or outputs: name -> dtype and a shape of axis names and sizes."""
        out: dict[str, TensorSpec] = {}
        for name, spec in self.obj(graph, kind, label).items():
            where = f"{label}.{name}"
            if not isinstance(spec, dict):
                raise ArtifactError(f"{self.where}: '{where}' must be an object with dtype and shape")
            shape = self.array(spec, "shape", f"{where}.shape")
            if not all(isinstance(d, str) or int_in(d, 0, MAX_DIM) for d in shape):
                raise ArtifactError(f"{self.where}: '{where}.shape' {shape} must hold axis names and sizes")
            out[name] = TensorSpec(self.string(spec, "dtype", f"{where}.dtype"), shape)
        return out
