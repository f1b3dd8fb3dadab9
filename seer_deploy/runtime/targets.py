"""Open any TARGET as a `Backend`: a checkpoint ('demo', 'demo-vl' or a directory: torch), an export directory
(ONNX Runtime), or an engine directory (ONNX Runtime or TensorRT, checked against its export and this machine before
loading). A multimodal target is one of these whose backend also takes pictures (`core.backend.ImageBackend`).

Everything a caller needs besides the backend comes from the artifact itself (`TargetInfo`): the model config, the
special ids, the tokenizer, the image settings; the calibrated Seer config is found by `find_seer_config`, before
anything loads. So the generation service treats every kind of target the same way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import numpy as np
from PIL import Image

from seer_deploy.contracts.export_manifest import MANIFEST_FILE as EXPORT_FILE
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.backend import Backend, ImageBackend, PatchBackend
from seer_deploy.core.backend_names import BACKEND_CHOICES, BackendChoice
from seer_deploy.core.checks import ascii_int
from seer_deploy.core.errors import ArtifactError, CheckpointError, ConfigError
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.engines.manifest import MANIFEST_FILE as ENGINE_FILE
from seer_deploy.engines.manifest import EngineManifest
from seer_deploy.models.checkpoints.multimodal_files import DEMO_VL_NAME, checkpoint_directory, is_multimodal_checkpoint
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.pictures.anyres import AnyresConfig, anyres_tokens
from seer_deploy.models.pictures.image import ImageConfig
from seer_deploy.models.pictures.qwen_pictures import QwenPictures
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.models.text.tokenizer_files import TokenizerFacts
from seer_deploy.seer.config import CHECKPOINT_CONFIG_NAME, SeerConfig

TargetKind = Literal["checkpoint", "export", "engine"]
DEMO_TARGETS = ("demo", DEMO_VL_NAME)
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class TargetOptions:
    """How to open a target (`--backend`, `--provider`, `--threads`, `--device`, `--io-binding`, `--cuda-graph`).
    None keeps what the artifact says (an engine dir's session settings) or the default. The ONNX Runtime session
    settings are made from it in one place (`runtime.openers.ort_session_options`)."""

    backend: BackendChoice | None = None  # None: the target's own (checkpoint torch, export ort, engine its build's)
    providers: tuple[str, ...] | None = None  # ONNX Runtime providers in order of preference
    threads: int | None = None  # intra-op threads (ONNX Runtime's session; torch's for a checkpoint); 0: the default
    # "cpu", "cuda" or "cuda:N": where torch runs a checkpoint, the CUDA provider's device (an export), the GPU of a
    # TensorRT engine. None: the target's default (torch: cpu; ONNX Runtime: CUDA when installed; TensorRT: GPU 0).
    device: str | None = None
    io_binding: bool = False  # ONNX Runtime: IO binding (engines.ort_binding)
    cuda_graph: bool = False  # ONNX Runtime on CUDA: one CUDA graph per call shape (implies io_binding)

    def check(self) -> None:
        """ConfigError for an unknown backend, negative threads or a malformed device, before anything loads."""
        if self.backend is not None and self.backend not in BACKEND_CHOICES:
            raise ConfigError(f"backend '{self.backend}' is unknown; use one of {', '.join(BACKEND_CHOICES)}")
        if self.threads is not None and self.threads < 0:
            raise ConfigError(f"--threads must be >= 0 (0 = the engine's default), got {self.threads}")
        parse_device(self.device)


def parse_device(text: str | None) -> tuple[str, int]:
    """'cpu' -> ('cpu', 0); 'cuda' / 'cuda:N' -> ('cuda', N); None -> ('default', 0); anything else a ConfigError."""
    if text is None:
        return "default", 0
    kind, _, index = text.strip().lower().partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    number = ascii_int(index) if index else 0
    if kind == "cuda" and number is not None and number >= 0 and not index.startswith(("+", "-")):
        return "cuda", number
    raise ConfigError(f"--device {text!r} is not a device; use cpu, cuda or cuda:N (N = the GPU's index)")


@dataclass(frozen=True)
class TemplateChoice:
    """A chat template chosen instead of the target's own: its text (None: raw text) and where it came from."""

    text: str | None
    source: str


@dataclass(frozen=True)
class ImageSupport:
    """How a multimodal target takes pictures: preprocessing, and how a `<image>` placeholder becomes ids."""

    image: ImageConfig | None  # a SigLIP tower's square views (None for Dimple's Qwen2.5-VL tower: `qwen`)
    tokens_per_image: int  # one view's tokens (Dimple: the fewest a picture can have)
    image_token_index: int  # the placeholder id the tokenizer emits for `<image>`
    id_base: int  # image ids start here (the language model's embedding rows)
    anyres: AnyresConfig | None = None  # LaViDa's tiling: a picture's token count depends on its size
    qwen: QwenPictures | None = None  # Dimple: pictures at their own size, M-RoPE positions

    def picture_tokens(self, picture: Image.Image, name: str = "the picture") -> int:
        """The image tokens one picture becomes in a prompt (ConfigError for a picture Dimple's rules refuse)."""
        if self.qwen is not None:
            return self.qwen.picture.tokens(*picture.size, name)
        if self.anyres is None:
            return self.tokens_per_image
        return anyres_tokens(picture.size, self.anyres, math.isqrt(self.tokens_per_image - 1))

    def set_pictures(self, backend: Backend, pictures: Sequence[Image.Image], per_call: int | None = None
                     ) -> list[int]:
        """Encode pictures with the target's tower (`per_call` of them a call; None: all in one) and set them as the
        backend's image table (with their M-RoPE layout for Dimple); each picture's token count, in order (what
        expand_placeholders takes)."""
        from seer_deploy.models.prompts.image_placeholders import encode_pictures

        step = per_call or max(1, len(pictures))
        calls = [pictures[lo : lo + step] for lo in range(0, len(pictures), step)] or [[]]
        if self.qwen is not None:
            qwen, patch_backend = self.qwen, cast(PatchBackend, backend)  # a Dimple target's backend
            parts = [qwen.encode(patch_backend.encode_patches, call) for call in calls]
            embeds = [e for part, _ in parts for e in part]
            patch_backend.set_image_table(embeds, np.concatenate([layout for _, layout in parts]))
        else:
            assert self.image is not None  # a SigLIP tower's target has its view settings
            image, image_backend = self.image, cast(ImageBackend, backend)  # a multimodal target's backend
            embeds = [e for call in calls for e in encode_pictures(image_backend.encode_images, call, image,
                                                                   self.anyres)]
            image_backend.set_image_table(embeds)
        return [len(e) for e in embeds]


@dataclass(frozen=True)
class TargetInfo:
    """What a target is and what running it needs besides the backend."""

    target: str
    kind: TargetKind
    backend: BackendChoice
    path: Path  # the checkpoint, export or engine directory
    config: ModelConfig
    mask_id: int
    eos_id: int
    pad_id: int  # what left padding holds (EOS when the model has no pad token)
    eot_id: int | None
    tokenizer_dir: Path | None  # the directory whose tokenizer files are read (models.text.tokenizer_files)
    checkpoint: str | None  # the source checkpoint ('demo' or a path) when known
    export_dir: Path | None = None
    buckets: tuple[int, ...] = ()  # engine dirs: the kept-length buckets the engine was built for
    max_batch: int | None = None  # TensorRT engines: the largest batch the profiles cover
    images: ImageSupport | None = None  # multimodal targets
    # What the opener read about the tokenizer (an export's manifest): None, read from the tokenizer's own files
    tokenizer_facts: TokenizerFacts | None = None
    # The statistics the export's step zero computes (its manifest); None: a checkpoint, whose torch backend
    # computes what the run's Seer config reads
    stats: StatsSpec | None = None

    def tokenizer(self, template: TemplateChoice | None = None) -> Tokenizer:
        """The target's tokenizer with its chat template, or the one `template` chooses (--chat-template FILE,
        --no-chat-template)."""
        if self.tokenizer_dir is None:
            where = f"{self.path}" + (f" or its checkpoint {self.checkpoint}" if self.checkpoint else "")
            raise ArtifactError(
                f"no tokenizer in {where} (needs {TOKENIZER_FILE}, or vocab.json + merges.txt); copy the "
                f"checkpoint's tokenizer files into {self.path}"
            )
        chat = None if template is None else (template.text, template.source)
        if self.images is not None:
            from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer

            marks = self.images.qwen.marks if self.images.qwen is not None else None
            return MultimodalTokenizer(self.tokenizer_dir, self.eos_id, self.eot_id, self.images.image_token_index,
                                       template=chat, described=self.tokenizer_facts, picture_marks=marks)
        return Tokenizer(self.tokenizer_dir, self.eos_id, self.eot_id, template=chat, described=self.tokenizer_facts)

    def seer_for(self, seer: SeerConfig | None) -> SeerConfig | None:
        """Seer as this target runs it: on TensorRT kept lengths round up to the engine's buckets (its profiles).
        ConfigError when the config reads statistics the export does not compute (other thresholds or layers): its
        floors were calibrated on other numbers, so its cuts would be wrong, not just different."""
        if seer is None:
            return None
        if self.stats is not None and seer.needs_sparsity:
            why = self.stats.missing_for(seer.stats_spec(self.config.n_layers))
            if why is not None:
                raise ConfigError(
                    f"the Seer config reads MLP statistics at {why} by the export {self.export_dir}; give a "
                    f"--seer-config calibrated on it (seer-deploy calibrate {self.target}) or re-export with "
                    f"--seer-config FILE")
        if self.backend != "tensorrt" or seer.buckets:
            return seer
        return seer.with_(buckets=self.buckets)


def target_kind(target: str | os.PathLike[str]) -> TargetKind:
    """Which kind of directory TARGET is, from the file that marks it (engine.json, manifest.json, config.json)."""
    if str(target) in DEMO_TARGETS:
        return "checkpoint"
    path = Path(target).expanduser()
    if not path.exists():
        raise ConfigError(
            f"TARGET '{target}' does not exist; give a checkpoint directory or 'demo', an export directory "
            f"(seer-deploy export) or an engine directory (seer-deploy build)"
        )
    if not path.is_dir():
        raise ConfigError(f"TARGET '{target}' is a file; give a checkpoint, export or engine directory")
    if (path / ENGINE_FILE).is_file():
        return "engine"
    if (path / EXPORT_FILE).is_file():
        return "export"
    if (path / "config.json").is_file():
        return "checkpoint"
    raise ArtifactError(
        f"{path} holds no {ENGINE_FILE} (engine dir), {EXPORT_FILE} (export dir) or config.json (checkpoint); "
        f"give one of those directories as TARGET"
    )


@dataclass(frozen=True)
class Description:
    """What TARGET is, decided once: its kind and directory, whether it takes pictures, the checkpoint it comes from
    (itself, or an export's source where it still exists), and for an export or engine dir its manifests, each read
    and checked once. Everything downstream (the Seer config's search, the opener, the tokenizer) takes it."""

    target: str
    kind: TargetKind
    path: Path
    multimodal: bool
    checkpoint: Path | None  # the checkpoint directory: TARGET itself, or the export's source (None: gone)
    engine: EngineManifest | None = None  # engine dirs
    export_dir: Path | None = None  # export dirs, and the export an engine was built from
    export: ExportManifest | None = None


def describe(target: str | os.PathLike[str]) -> Description:
    """TARGET's kind and manifests (ConfigError / ArtifactError for what is not a target, or a damaged manifest)."""
    from seer_deploy.contracts.multimodal import MULTIMODAL_KEY

    kind = target_kind(target)
    path = Path(target).expanduser()
    if kind == "checkpoint":
        return Description(str(target), kind, path, is_multimodal_checkpoint(target), checkpoint_directory(target))
    engine = EngineManifest.load(path) if kind == "engine" else None
    export_dir = path if engine is None else engine_export_dir(path, engine)
    export = ExportManifest.load(export_dir)
    return Description(str(target), kind, path, MULTIMODAL_KEY in export.extra, source_checkpoint(export.model.source),
                       engine, export_dir, export)


def checkpoint_seer(checkpoint: str | os.PathLike[str]) -> SeerConfig | None:
    """A checkpoint's calibrated Seer config (`<dir>/seer.json`, the shipped one for the demos), or None."""
    return SeerConfig.shipped_in(checkpoint_directory(checkpoint))


def find_seer_config(target: str | os.PathLike[str], described: Description | None = None) -> SeerConfig | None:
    """The calibrated Seer config of TARGET, found without loading any model: a seer.json beside an engine dir,
    then beside its export dir, then the source checkpoint's own; None when there is none. `described`: TARGET's
    description when the caller has it (its manifests are not read again)."""
    d = described if described is not None else describe(target)
    beside = [] if d.kind == "checkpoint" else [d.path, d.export_dir]
    for directory in beside:
        if directory is not None and (directory / CHECKPOINT_CONFIG_NAME).is_file():
            return SeerConfig.load(directory / CHECKPOINT_CONFIG_NAME)
    return SeerConfig.shipped_in(d.checkpoint) if d.checkpoint is not None else None


def engine_export_dir(engine_dir: Path, manifest: EngineManifest) -> Path:
    """The export an engine was built from: the path recorded at build time, else the engine dir's parent
    (`seer-deploy export --build` puts the engine in DIR/engine)."""
    recorded = manifest.extra.get("export_dir")
    candidates = ([Path(str(recorded))] if recorded else []) + [engine_dir.parent]
    for candidate in candidates:
        if (candidate / EXPORT_FILE).is_file():
            return candidate
    raise ArtifactError(
        f"{engine_dir} was built from the export {recorded or '(not recorded)'}, which is gone; the engine needs it "
        f"(its weights and manifest): move the export back or rebuild (seer-deploy build EXPORT_DIR --out {engine_dir})"
    )


def source_checkpoint(source: str) -> Path | None:
    """The directory of an export's source checkpoint ('demo', 'demo-vl' or a path), or None where it is gone."""
    try:
        directory = checkpoint_directory(source)
    except CheckpointError:
        return None
    return directory if (directory / "config.json").is_file() else None
