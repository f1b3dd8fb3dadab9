"""The sections of an export's `manifest.json` as typed records (graphs and their tensors, the model, the statistics
the step graph reports, the weights file), and `SectionReader`: typed field access that turns a missing, mistyped or
out-of-range value into one ArtifactError naming its key, so a damaged or hostile manifest never reaches a backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seer_deploy.contracts.graphs import CACHE_GRAPH_NAMES, STEP_GRAPH_NAMES
from seer_deploy.contracts.multimodal import MULTIMODAL_KEY
from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.checks import int_in
from seer_deploy.core.errors import ArtifactError, SeerDeployError
from seer_deploy.core.fields import FieldReader
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.pictures.image import ImageConfig

SPECIAL_ID_NAMES: tuple[str, ...] = ("mask", "eos", "pad", "bos", "eot")
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
    """What an export recorded about one graph file: its hash and its inputs and outputs as traced (contracts.graphs
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
    fingerprint: str  # models.checkpoints.checkpoint.checkpoint_fingerprint of the checkpoint directory
    config: dict[str, Any]  # ModelConfig.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "layout": self.layout, "fingerprint": self.fingerprint, "config": self.config}


@dataclass(frozen=True)
class WeightsSpec:
    """The one external-data file both graphs read their initializers from."""

    file: str
    sha256: str
    bytes: int
    quantization: Quantization | None = None  # how its linear layers were quantized (export --quantize)

    def to_dict(self) -> dict[str, Any]:
        quantized = {"quantization": self.quantization.to_dict()} if self.quantization is not None else {}
        return {"file": self.file, "sha256": self.sha256, "bytes": self.bytes, **quantized}


class SectionReader(FieldReader):
    """The manifest's sections read through `FieldReader`: each refusal names its key and asks for a re-export."""

    def __init__(self, where: str) -> None:
        super().__init__(where, "re-export the model")

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

    def seer(self, seer: dict[str, Any], n_layers: int) -> StatsSpec:
        """The statistics section: layers the model has, this seer-deploy's statistics, rows over them."""
        layers = self.array(seer, "stats_layers", "seer.stats_layers")
        names = self.array(seer, "stat_names", "seer.stat_names")
        rows = self.array(seer, "sparsity_rows", "seer.sparsity_rows")
        if not all(int_in(v, 0, n_layers - 1) for v in layers) or len(set(layers)) != len(layers):
            raise ArtifactError(f"{self.where}: seer.stats_layers {layers} must be distinct layers of the "
                                f"{n_layers}-layer model; re-export the model")
        if names != list(STAT_NAMES):
            raise ArtifactError(f"{self.where}: seer.stat_names {names} are not this seer-deploy's statistics "
                                f"{list(STAT_NAMES)}; re-export the model")
        spec = StatsSpec(tuple(layers), self.number(seer, "abs_threshold", "seer.abs_threshold"),
                         self.number(seer, "rel_threshold", "seer.rel_threshold"))
        if rows != [[layer, stat] for layer, stat in spec.sparsity_rows]:
            raise ArtifactError(f"{self.where}: seer.sparsity_rows must be the [layer, stat_name] pairs of "
                                "seer.stats_layers and seer.stat_names, layer-major; re-export the model")
        return spec

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
