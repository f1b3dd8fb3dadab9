"""`open_target`: one opener per kind of target, each returning the backend that runs it and its `TargetInfo`.

An option a target cannot honour is refused here with the reason, before anything heavy loads: a checkpoint runs on
torch only, an export on ONNX Runtime, an engine on what it was built for; ONNX Runtime providers mean nothing to
torch or TensorRT.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from seer_deploy.contracts.export_manifest import MANIFEST_FILE as EXPORT_FILE
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.backend import Backend
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines.manifest import EngineManifest, RuntimeFacts, check_engine_compatible
from seer_deploy.models.checkpoints.multimodal_files import is_dimple_checkpoint
from seer_deploy.models.pictures.anyres import AnyresConfig
from seer_deploy.models.pictures.image import ImageConfig
from seer_deploy.models.pictures.qwen_pictures import QwenPictures
from seer_deploy.models.text.tokenizer_files import TokenizerFacts, has_tokenizer
from seer_deploy.runtime.targets import (
    TOKENIZER_FILE,
    BackendChoice,
    Description,
    ImageSupport,
    TargetInfo,
    TargetOptions,
    describe,
    parse_device,
)
from seer_deploy.seer.config import SeerConfig

if TYPE_CHECKING:
    import torch

    from seer_deploy.engines.ort import OrtSessionOptions


def open_target(
    target: str | os.PathLike[str], options: TargetOptions | None = None, described: Description | None = None, *,
    seer: SeerConfig | None = None,
) -> tuple[Backend, TargetInfo]:
    """The backend that runs TARGET and what it needs (ids, tokenizer, image settings); `options.backend` None picks
    the target's own (checkpoint: torch, export: ort, engine: what it was built for). `described`: TARGET's
    description (`targets.describe`) when the caller has it, so its manifests are read once. `seer`: the Seer config
    the run reads, whose statistics a checkpoint's torch step zero computes (an export's are fixed:
    `TargetInfo.seer_for`)."""
    options = options or TargetOptions()
    options.check()
    d = described if described is not None else describe(target)
    if d.kind == "checkpoint":
        return open_checkpoint(d, options, seer)
    if d.kind == "export":
        return open_export(d, options)
    return open_engine(d, options)


def open_checkpoint(d: Description, options: TargetOptions, seer: SeerConfig | None = None
                    ) -> tuple[Backend, TargetInfo]:
    """torch eager on a checkpoint (LLaDA or LLaDA-V layout)."""
    target = d.target
    import torch

    from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
    from seer_deploy.models.checkpoints.dimple import load_dimple
    from seer_deploy.models.checkpoints.multimodal import load_multimodal
    from seer_deploy.runtime.torch_backend import DimpleTorchBackend, MultimodalTorchBackend, TorchBackend

    backend = options.backend
    if backend not in (None, "torch"):
        build = "ort" if backend == "ort" else "tensorrt"
        raise ConfigError(
            f"TARGET '{target}' is a checkpoint, which runs on torch; for {backend} export and build it first "
            f"(seer-deploy export {target} --out DIR --build {build}) and give DIR/engine as TARGET"
        )
    if options.providers or options.io_binding or options.cuda_graph:
        flag = "--provider" if options.providers else "--io-binding" if options.io_binding else "--cuda-graph"
        raise ConfigError(f"{flag} sets ONNX Runtime sessions, but TARGET '{target}' is a checkpoint, which runs on "
                          f"torch; drop {flag} (--device chooses torch's device) or give an export or engine directory")
    device = torch_device(options.device)
    if options.threads:
        torch.set_num_threads(options.threads)
    images = None
    torch_backend: TorchBackend
    if d.multimodal and is_dimple_checkpoint(target):
        dimple = load_dimple(target, device=device)
        ckpt = dimple.lm
        stats = seer.stats_spec(ckpt.config.n_layers) if seer is not None else None
        torch_backend = DimpleTorchBackend(dimple, stats)
        images = dimple_image_support(dimple.pictures, dimple.image_token_index, ckpt.config.n_embed_rows)
    elif d.multimodal:
        loaded = load_multimodal(target)
        loaded.lm.model.to(device)
        loaded.vision.to(device)
        ckpt = loaded.lm
        stats = seer.stats_spec(ckpt.config.n_layers) if seer is not None else None
        torch_backend = MultimodalTorchBackend(loaded, stats)
        vcfg = loaded.vision_config
        images = ImageSupport(vcfg.image, vcfg.tokens_per_image, vcfg.image_token_index, ckpt.config.n_embed_rows,
                              vcfg.anyres)
    else:
        ckpt = load_checkpoint(target)
        stats = seer.stats_spec(ckpt.config.n_layers) if seer is not None else None
        torch_backend = TorchBackend(ckpt.model.to(device), stats)
    cfg = ckpt.config
    info = TargetInfo(
        target=target, kind="checkpoint", backend="torch", path=ckpt.path, config=cfg, mask_id=cfg.mask_id,
        eos_id=cfg.eos_id, pad_id=cfg.pad_id if cfg.pad_id is not None else cfg.eos_id, eot_id=cfg.eot_id,
        tokenizer_dir=ckpt.path if has_tokenizer(ckpt.path) else None, checkpoint=target, images=images,
        tokenizer_facts=TokenizerFacts(cfg.image_code_range, None),  # the config is read: not again
    )
    return torch_backend, info


def dimple_image_support(pictures: QwenPictures, image_token_index: int, id_base: int) -> ImageSupport:
    """How a Dimple target takes pictures: each at its own size, `tokens_per_image` the fewest a picture becomes."""
    return ImageSupport(None, pictures.picture.fewest_tokens, image_token_index, id_base, qwen=pictures)


def torch_device(text: str | None) -> torch.device:
    """The torch device --device names (cpu by default); ConfigError when this torch cannot reach it."""
    import torch

    kind, index = parse_device(text)
    if kind != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {text}: this torch ({torch.__version__}) sees no CUDA GPU; install a CUDA build "
                          "of torch on a machine with an NVIDIA GPU, or use --device cpu")
    if index >= torch.cuda.device_count():
        raise ConfigError(f"--device {text}: this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                          f"(0..{torch.cuda.device_count() - 1}); pick one of them")
    return torch.device("cuda", index)


def ort_session_options(options: TargetOptions, recorded: dict[str, Any] | None = None) -> OrtSessionOptions:
    """ONNX Runtime session settings: an engine dir's recorded ones (`recorded`), with the caller's providers,
    threads, device, IO binding and CUDA graphs on top; ConfigError where --device and --provider disagree.
    ONNX Runtime is imported here, when a target runs on it, not by whoever imports the openers (`--help`, torch)."""
    from seer_deploy.engines.ort import CPU, CUDA, OrtSessionOptions

    session = recorded or {}
    kind, index = parse_device(options.device)
    providers = options.providers
    if kind == "cuda" and providers is not None and CUDA not in providers:
        raise ConfigError(f"--device {options.device} runs ONNX Runtime on CUDA, but --provider lists "
                          f"{', '.join(providers)}; add {CUDA} or drop one of the two")
    if kind == "cpu" and providers is not None and CUDA in providers:
        raise ConfigError(f"--device cpu and --provider {CUDA} disagree; drop one of the two")
    if providers is None and kind != "default":
        providers = (CUDA, CPU) if kind == "cuda" else (CPU,)
    if providers is None:
        providers = tuple(str(p) for p in session.get("providers") or ()) or None
    return OrtSessionOptions(
        providers=providers,
        intra_op_threads=options.threads if options.threads is not None else int(session.get("intra_op_threads", 0)),
        inter_op_threads=int(session.get("inter_op_threads", 0)),
        graph_optimization=session.get("graph_optimization", "all"),
        io_binding=options.io_binding, cuda_graph=options.cuda_graph, device_id=index,
    )


def _export_info(d: Description, backend: BackendChoice) -> TargetInfo:
    """Ids from the export manifest's special_ids; the tokenizer beside the export, else its source checkpoint's."""
    export, export_dir = d.export, d.export_dir
    assert export is not None and export_dir is not None  # describe() reads them for an export or engine dir
    cfg = export.model_config()
    ids = export.special_ids
    mask, eos = ids.get("mask"), ids.get("eos")
    if mask is None or eos is None:
        raise ArtifactError(f"{export_dir / EXPORT_FILE}: special_ids has no mask or eos id; re-export the model")
    source = d.checkpoint
    tokenizer: Path | None = export_dir if (export_dir / TOKENIZER_FILE).is_file() else None
    if tokenizer is None and source is not None and has_tokenizer(source):
        tokenizer = source
    pad = ids.get("pad")
    entry = export.extra.get("tokenizer")  # what the export recorded of the tokenizer beside it
    facts = TokenizerFacts(cfg.image_code_range, entry if isinstance(entry, dict) and tokenizer == export_dir else None)
    return TargetInfo(
        target=d.target, kind=d.kind, backend=backend, path=d.path, config=cfg, mask_id=mask, eos_id=eos,
        pad_id=pad if pad is not None else eos, eot_id=ids.get("eot"), tokenizer_dir=tokenizer,
        checkpoint=export.model.source if source is not None else None, export_dir=export_dir,
        tokenizer_facts=facts, stats=export.seer,
    )


def _ort_backend(d: Description, session: OrtSessionOptions, info: TargetInfo, kv_cache: bool = True
                 ) -> tuple[Backend, TargetInfo]:
    """ONNX Runtime on an export: a text export's graphs, or a multimodal export's with its vision graph; the KV
    cache graphs too where the export has them and `kv_cache` (an engine dir: where it was built with them)."""
    export_dir, export = d.export_dir, d.export
    assert export is not None and export_dir is not None  # describe() reads them for an export or engine dir
    from seer_deploy.engines.ort_multimodal import DimpleOrtBackend, MultimodalOrtBackend, backend_class

    opened = backend_class(export)(export_dir, session, kv_cache=kv_cache, manifest=export)
    if not opened.takes_pictures:
        return opened, info
    if isinstance(opened, DimpleOrtBackend):  # Dimple's Qwen2.5-VL tower
        return opened, replace(info, images=dimple_image_support(opened.pictures, opened.image_token_index,
                                                                 opened.image_id_base))
    backend = cast(MultimodalOrtBackend, opened)
    vision = backend.multimodal["vision_config"]
    image = vision["image"]
    settings = ImageConfig(int(image["image_size"]), tuple(image["mean"]), tuple(image["std"]), str(image["aspect"]))
    images = ImageSupport(settings, backend.tokens_per_image, backend.image_token_index, backend.image_id_base,
                          AnyresConfig.from_dict(vision.get("anyres")))
    return backend, replace(info, images=images)


def open_export(d: Description, options: TargetOptions) -> tuple[Backend, TargetInfo]:
    """ONNX Runtime on an export directory."""
    path, target, export, backend = d.path, d.target, d.export, options.backend
    assert export is not None  # describe() reads an export dir's manifest
    if backend == "torch":
        raise ConfigError(
            f"TARGET '{target}' is an export directory (ONNX); for torch give its checkpoint ({export.model.source})"
        )
    if backend == "tensorrt":
        raise ConfigError(
            f"TARGET '{target}' is an export directory; build a TensorRT engine from it first "
            f"(seer-deploy build {target} --out {path / 'engine'} --backend tensorrt) and give that as TARGET"
        )
    session = ort_session_options(options)
    session.check()
    return _ort_backend(d, session, _export_info(d, "ort"))


def checked_engine(d: Description) -> tuple[EngineManifest, Path, ExportManifest, RuntimeFacts]:
    """An engine dir's manifest, its export (dir and manifest) and the facts it was checked against: a stale engine
    (another model, graphs, backend or ONNX Runtime version) is an error before anything loads, not an answer."""
    import onnxruntime

    manifest, export_dir, export = d.engine, d.export_dir, d.export
    assert manifest is not None and export_dir is not None and export is not None  # describe() reads them
    facts = RuntimeFacts(
        model_fingerprint=export.model.fingerprint,
        graph_hashes={name: graph.sha256 for name, graph in export.graphs.items()},  # a graph gone: refused
        backend=manifest.backend,
        onnxruntime_version=onnxruntime.__version__,
    )
    check_engine_compatible(manifest, facts)
    return manifest, export_dir, export, facts


def engine_session_options(manifest: EngineManifest, options: TargetOptions) -> OrtSessionOptions:
    """The ONNX Runtime session settings an ORT engine dir records, with the caller's settings on top."""
    session = ort_session_options(options, manifest.ort_session)
    session.check()
    return session


def open_engine(d: Description, options: TargetOptions) -> tuple[Backend, TargetInfo]:
    """The engine an engine dir was built for, after checking it against its export and this machine."""
    path, target = d.path, d.target
    manifest, export_dir, export, facts = checked_engine(d)
    wanted = options.backend or manifest.backend
    if wanted != manifest.backend:
        fix = (f"give its export ({export_dir}) as TARGET" if wanted == "ort" else
               f"build one (seer-deploy build {export_dir} --out ENGINE_DIR --backend {wanted})" if wanted == "tensorrt"
               else f"give its checkpoint ({export.model.source})")
        raise ConfigError(f"TARGET '{target}' is a {manifest.backend} engine, not {wanted}; for {wanted} {fix}")
    info = replace(_export_info(d, manifest.backend), buckets=tuple(manifest.buckets))
    if manifest.backend == "tensorrt":
        from seer_deploy.engines.tensorrt_engine import StepModel, TensorRTBackend

        if options.providers or options.threads is not None or options.io_binding:
            raise ConfigError(f"--provider, --threads and --io-binding set ONNX Runtime sessions, but TARGET "
                              f"'{target}' is a TensorRT engine; drop them (TensorRT picks its own kernels and always "
                              "runs on device buffers)")
        kind, index = parse_device(options.device)
        if kind == "cpu":
            raise ConfigError(f"TARGET '{target}' is a TensorRT engine, which runs on a GPU; use --device cuda[:N] "
                              f"or give its export ({export_dir}) to run on the CPU")
        trt = TensorRTBackend.open(path, facts, StepModel.of(export), device=index, cuda_graph=options.cuda_graph)
        return trt, replace(info, max_batch=manifest.max_batch)
    # An ORT engine dir runs the export's graphs with its recorded session settings: the cache graphs where it was
    # built with them (their hashes checked above), none where it was built before the export had them.
    return _ort_backend(d, engine_session_options(manifest, options), info, kv_cache=manifest.has_cache)

