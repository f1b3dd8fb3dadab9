"""Open any TARGET as a `Backend`: a checkpoint ('demo' or a directory: torch), an export directory (ONNX Runtime),
or an engine directory (ONNX Runtime or TensorRT, checked against its export and this machine before loading).

Everything a caller needs besides the backend comes from the artifact itself (`TargetInfo`): the model config, the
special ids, the tokenizer and the calibrated Seer config, so `generate`, `demo` and the benchmarks treat every
kind of target the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from seer_deploy.core.backend import Backend
from seer_deploy.core.errors import ArtifactError, CheckpointError, ConfigError
from seer_deploy.engines.manifest import MANIFEST_FILE as ENGINE_FILE
from seer_deploy.engines.manifest import EngineManifest, RuntimeFacts, check_engine_compatible
from seer_deploy.models.checkpoint import DEMO_NAMES, resolve_checkpoint
from seer_deploy.models.config import ModelConfig
from seer_deploy.models.tokenizer import Tokenizer
from seer_deploy.seer.config import CHECKPOINT_CONFIG_NAME, SeerConfig
from seer_deploy.spec.export_manifest import MANIFEST_FILE as EXPORT_FILE
from seer_deploy.spec.export_manifest import ExportManifest

if TYPE_CHECKING:
    from seer_deploy.engines.ort import OrtSessionOptions

TargetKind = Literal["checkpoint", "export", "engine"]
BackendChoice = Literal["torch", "ort", "tensorrt"]
BACKEND_CHOICES: tuple[BackendChoice, ...] = ("torch", "ort", "tensorrt")
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class TargetOptions:
    """How to open a target. None keeps what the artifact says (an engine dir's session settings) or the default."""

    providers: tuple[str, ...] | None = None  # ONNX Runtime providers in order of preference
    threads: int | None = None  # ONNX Runtime intra-op threads (0 = ONNX Runtime's default)
    device: int = 0  # TensorRT: the CUDA device
    seer: SeerConfig | None = None  # torch: step zero reports the statistics this config reads (default: every layer)


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
    tokenizer_file: Path | None
    checkpoint: str | None  # the source checkpoint ('demo' or a path) when known: where its Seer config lives
    export_dir: Path | None = None
    buckets: tuple[int, ...] = ()  # engine dirs: the kept-length buckets the engine was built for
    max_batch: int | None = None  # TensorRT engines: the largest batch the profiles cover

    def tokenizer(self) -> Tokenizer:
        if self.tokenizer_file is None:
            where = f"{self.path}" + (f" or its checkpoint {self.checkpoint}" if self.checkpoint else "")
            raise ArtifactError(
                f"no {TOKENIZER_FILE} in {where}; copy the checkpoint's {TOKENIZER_FILE} into {self.path}"
            )
        return Tokenizer(self.tokenizer_file, self.eos_id, self.eot_id)

    def seer_config(self) -> SeerConfig | None:
        """The calibrated Seer config: a seer.json beside the artifact (engine, then export dir), else the
        checkpoint's own (the shipped one for 'demo'); None when there is none."""
        for directory in (self.path, self.export_dir):
            if directory is not None and (directory / CHECKPOINT_CONFIG_NAME).is_file():
                return SeerConfig.load(directory / CHECKPOINT_CONFIG_NAME)
        if self.checkpoint is None:
            return None
        return SeerConfig.for_checkpoint(self.checkpoint)

    def fit_seer(self, seer: SeerConfig | None) -> SeerConfig | None:
        """Seer as this target runs it: on TensorRT kept lengths round up to the engine's buckets (its profiles)."""
        if seer is None or self.backend != "tensorrt" or seer.buckets:
            return seer
        return seer.with_(buckets=self.buckets)


def target_kind(target: str | os.PathLike[str]) -> TargetKind:
    """Which kind of directory TARGET is, from the file that marks it (engine.json, manifest.json, config.json)."""
    if str(target) in DEMO_NAMES:
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


def calibrated_seer(target: str | os.PathLike[str]) -> SeerConfig | None:
    """The calibrated Seer config of TARGET without loading any model (see `TargetInfo.seer_config`)."""
    kind = target_kind(target)
    if kind == "checkpoint":
        return SeerConfig.for_checkpoint(target)
    path = Path(target).expanduser()
    if (path / CHECKPOINT_CONFIG_NAME).is_file():
        return SeerConfig.load(path / CHECKPOINT_CONFIG_NAME)
    export_dir = path if kind == "export" else engine_export_dir(path, EngineManifest.load(path))
    if (export_dir / CHECKPOINT_CONFIG_NAME).is_file():
        return SeerConfig.load(export_dir / CHECKPOINT_CONFIG_NAME)
    source = ExportManifest.load(export_dir).model.source
    return SeerConfig.for_checkpoint(source) if _checkpoint_exists(source) else None


def open_target(
    target: str | os.PathLike[str], backend: BackendChoice | None = None, options: TargetOptions | None = None
) -> tuple[Backend, TargetInfo]:
    """The backend that runs TARGET and what it needs (ids, tokenizer, Seer config); `backend` None picks the
    target's own (checkpoint: torch, export: ort, engine: what it was built for)."""
    options = options or TargetOptions()
    if backend is not None and backend not in BACKEND_CHOICES:
        raise ConfigError(f"backend '{backend}' is unknown; use one of {', '.join(BACKEND_CHOICES)}")
    kind = target_kind(target)
    if kind == "checkpoint":
        return _open_checkpoint(str(target), backend, options)
    if kind == "export":
        return _open_export(Path(target).expanduser(), str(target), backend, options)
    return _open_engine(Path(target).expanduser(), str(target), backend, options)


# ---------------------------------------------------------------- one opener per kind


def _open_checkpoint(target: str, backend: BackendChoice | None, options: TargetOptions) -> tuple[Backend, TargetInfo]:
    from seer_deploy.models.checkpoint import load_checkpoint
    from seer_deploy.runtime.torch_backend import TorchBackend

    if backend not in (None, "torch"):
        build = "ort" if backend == "ort" else "tensorrt"
        raise ConfigError(
            f"TARGET '{target}' is a checkpoint, which runs on torch; for {backend} export and build it first "
            f"(seer-deploy export {target} --out DIR --build {build}) and give DIR/engine as TARGET"
        )
    ckpt = load_checkpoint(target)
    cfg = ckpt.config
    stats = options.seer.stats_spec(cfg.n_layers) if options.seer is not None else None
    tok = ckpt.path / TOKENIZER_FILE
    info = TargetInfo(
        target=target, kind="checkpoint", backend="torch", path=ckpt.path, config=cfg, mask_id=cfg.mask_id,
        eos_id=cfg.eos_id, pad_id=cfg.pad_id if cfg.pad_id is not None else cfg.eos_id, eot_id=cfg.eot_id,
        tokenizer_file=tok if tok.is_file() else None, checkpoint=target,
    )
    return TorchBackend(ckpt.model, stats), info


def _export_info(target: str, kind: TargetKind, backend: BackendChoice, path: Path, export_dir: Path,
                 export: ExportManifest) -> TargetInfo:
    """Ids from the export manifest's special_ids; the tokenizer beside the export, else its source checkpoint's."""
    cfg = export.model_config()
    ids = export.special_ids
    mask, eos = ids.get("mask"), ids.get("eos")
    if mask is None or eos is None:
        raise ArtifactError(f"{export_dir / EXPORT_FILE}: special_ids has no mask or eos id; re-export the model")
    source = export.model.source
    tokenizer = export_dir / TOKENIZER_FILE
    if not tokenizer.is_file() and _checkpoint_exists(source):
        tokenizer = resolve_checkpoint(source) / TOKENIZER_FILE
    pad = ids.get("pad")
    return TargetInfo(
        target=target, kind=kind, backend=backend, path=path, config=cfg, mask_id=mask, eos_id=eos,
        pad_id=pad if pad is not None else eos, eot_id=ids.get("eot"),
        tokenizer_file=tokenizer if tokenizer.is_file() else None,
        checkpoint=source if _checkpoint_exists(source) else None, export_dir=export_dir,
    )


def _open_export(path: Path, target: str, backend: BackendChoice | None, options: TargetOptions
                 ) -> tuple[Backend, TargetInfo]:
    from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions

    export = ExportManifest.load(path)
    if backend == "torch":
        raise ConfigError(
            f"TARGET '{target}' is an export directory (ONNX); for torch give its checkpoint ({export.model.source})"
        )
    if backend == "tensorrt":
        raise ConfigError(
            f"TARGET '{target}' is an export directory; build a TensorRT engine from it first "
            f"(seer-deploy build {target} --out {path / 'engine'} --backend tensorrt) and give that as TARGET"
        )
    session = OrtSessionOptions(providers=options.providers, intra_op_threads=options.threads or 0)
    return OrtBackend(path, session), _export_info(target, "export", "ort", path, path, export)


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


def checked_engine(path: Path) -> tuple[EngineManifest, Path, ExportManifest, RuntimeFacts]:
    """An engine dir's manifest, its export (dir and manifest) and the facts it was checked against: a stale engine
    (another model, graphs, backend or ONNX Runtime version) is an error before anything loads, not an answer."""
    import onnxruntime

    manifest = EngineManifest.load(path)
    export_dir = engine_export_dir(path, manifest)
    export = ExportManifest.load(export_dir)
    facts = RuntimeFacts(
        model_fingerprint=export.model.fingerprint,
        graph_hashes={name: export.graphs[name].sha256 for name in manifest.graph_hashes},
        backend=manifest.backend,
        onnxruntime_version=onnxruntime.__version__,
    )
    check_engine_compatible(manifest, facts)
    return manifest, export_dir, export, facts


def engine_session_options(manifest: EngineManifest, options: TargetOptions) -> OrtSessionOptions:
    """The ONNX Runtime session settings an ORT engine dir records, with the caller's providers / threads on top."""
    from seer_deploy.engines.ort import OrtSessionOptions

    session = manifest.ort_session or {}
    return OrtSessionOptions(
        providers=options.providers or tuple(str(p) for p in session.get("providers") or ()) or None,
        intra_op_threads=options.threads if options.threads is not None else int(session.get("intra_op_threads", 0)),
        inter_op_threads=int(session.get("inter_op_threads", 0)),
        graph_optimization=session.get("graph_optimization", "all"),
    )


def _open_engine(path: Path, target: str, backend: BackendChoice | None, options: TargetOptions
                 ) -> tuple[Backend, TargetInfo]:
    manifest, export_dir, export, facts = checked_engine(path)
    wanted = backend or manifest.backend
    if wanted != manifest.backend:
        fix = (f"give its export ({export_dir}) as TARGET" if wanted == "ort" else
               f"build one (seer-deploy build {export_dir} --out ENGINE_DIR --backend {wanted})" if wanted == "tensorrt"
               else f"give its checkpoint ({export.model.source})")
        raise ConfigError(f"TARGET '{target}' is a {manifest.backend} engine, not {wanted}; for {wanted} {fix}")
    info = _export_info(target, "engine", manifest.backend, path, export_dir, export)
    if manifest.backend == "tensorrt":
        from seer_deploy.engines.tensorrt_engine import TensorRTBackend

        trt = TensorRTBackend.open(path, facts, sparsity_rows=list(export.seer.sparsity_rows),
                                   max_seq_len=export.max_seq_len, device=options.device)
        return trt, _with_layout(info, manifest, max_batch=manifest.max_batch)
    from seer_deploy.engines.ort import OrtBackend

    return OrtBackend(export_dir, engine_session_options(manifest, options)), _with_layout(info, manifest, None)


def _with_layout(info: TargetInfo, manifest: EngineManifest, max_batch: int | None) -> TargetInfo:
    return replace(info, buckets=tuple(manifest.buckets), max_batch=max_batch)


def _checkpoint_exists(source: str) -> bool:
    try:
        return (resolve_checkpoint(source) / "config.json").is_file()
    except CheckpointError:
        return False
