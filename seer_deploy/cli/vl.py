"""Generation with images, for `seer-deploy generate TARGET --image PATH --prompt TEXT` and `seer-deploy demo --vl`.

TARGET is a LLaDA-V-layout checkpoint directory or 'demo-vl' (torch reference loop, Seer optional), a multimodal
export directory or an ONNX Runtime engine directory built from one (ONNX Runtime, runtime loop). Images are handed
out to the prompts' `<image>` placeholders in order: with one prompt, all images are its own; with several, each
prompt takes as many as it has placeholders.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from PIL import Image

from seer_deploy.core.errors import ConfigError, SeerDeployError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.image import load_image, pixel_batch
from seer_deploy.models.image_prompts import (
    ImageConditionedModel,
    MultimodalTokenizer,
    expand_placeholders,
    image_table,
)
from seer_deploy.models.multimodal import DEMO_VL_NAME, IMAGE_TOKEN, load_multimodal, resolve_multimodal
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import CHECKPOINT_CONFIG_NAME, SeerConfig
from seer_deploy.seer.plan import SeerReport
from seer_deploy.spec.export_manifest import MANIFEST_FILE

if TYPE_CHECKING:
    from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend


@dataclass
class VlAnswer:
    prompt: str
    images: list[str]
    answer: str
    tokens: list[int]
    seer: SeerReport | None = None


@dataclass
class VlRun:
    answers: list[VlAnswer]
    backend: str
    steps_run: int
    tokens_processed: int
    seconds: float


def assign_images(texts: Sequence[str], images: Sequence[str | os.PathLike[str]]) -> list[list[str]]:
    """Hand the images to the prompts' `<image>` placeholders in order; ConfigError when the counts differ."""
    wanted = [t.count(IMAGE_TOKEN) for t in texts]
    total = sum(wanted)
    if total != len(images):
        if total == 0:
            fix = f"put '{IMAGE_TOKEN}' in the prompt where the image goes, e.g. --prompt '{IMAGE_TOKEN} colors'"
        elif total < len(images):
            fix = f"add an '{IMAGE_TOKEN}' per extra image or drop the extra --image"
        else:
            fix = f"give one --image per '{IMAGE_TOKEN}' or remove the extra placeholders"
        raise ConfigError(
            f"the prompt(s) hold {total} {IMAGE_TOKEN} placeholder(s) but {len(images)} image(s) were given; {fix}"
        )
    out, i = [], 0
    for n in wanted:
        out.append([str(p) for p in images[i : i + n]])
        i += n
    return out


def is_export_dir(target: str) -> bool:
    return Path(target).is_dir() and (Path(target) / MANIFEST_FILE).is_file()


def is_engine_dir(target: str) -> bool:
    from seer_deploy.engines.manifest import MANIFEST_FILE as ENGINE_FILE

    return Path(target).is_dir() and (Path(target) / ENGINE_FILE).is_file()


def export_of(target: str) -> Path | None:
    """The export directory behind TARGET: itself for an export dir, the one it was built from for an engine dir,
    None for anything else (a checkpoint). Broken engine manifests raise their own clear error."""
    if is_export_dir(target):
        return Path(target)
    if is_engine_dir(target):
        from seer_deploy.engines.manifest import EngineManifest
        from seer_deploy.runtime.targets import engine_export_dir

        return engine_export_dir(Path(target), EngineManifest.load(Path(target)))
    return None


def _is_multimodal_export(export_dir: Path) -> bool:
    from seer_deploy.spec.multimodal import MULTIMODAL_KEY

    try:
        raw = json.loads((export_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return False  # the export loader reports a broken manifest
    return isinstance(raw, dict) and isinstance(raw.get("extra"), dict) and MULTIMODAL_KEY in raw["extra"]


def wants_vl(target: str, images: Sequence[str]) -> bool:
    """Whether `generate` should take the multimodal path: images were given, or TARGET is demo-vl or a
    multimodal export or engine dir (a multimodal checkpoint without images also runs text-only through the text
    path)."""
    if images or target == DEMO_VL_NAME:
        return True
    try:
        export = export_of(target)
    except SeerDeployError:
        return False  # the text path reports the broken engine dir
    return export is not None and _is_multimodal_export(export)


def checkpoint_seer(target: str) -> SeerConfig | None:
    """The calibrated Seer config of a multimodal checkpoint (demo-vl's included), or for an export or engine dir: a
    seer.json beside it (engine dir, then export dir), else its checkpoint's."""
    try:
        export = export_of(target)
        if export is not None:
            for directory in (Path(target), export):
                if (directory / CHECKPOINT_CONFIG_NAME).is_file():
                    return SeerConfig.load(directory / CHECKPOINT_CONFIG_NAME)
            raw = json.loads((export / MANIFEST_FILE).read_text())
            target = str(raw["model"]["source"])
        file = resolve_multimodal(target) / CHECKPOINT_CONFIG_NAME
    except (SeerDeployError, KeyError, TypeError, json.JSONDecodeError):  # the loaders report bad targets
        return None
    return SeerConfig.load(file) if file.is_file() else None


def resolve_seer_vl(
    target: str, use_seer: bool | None, seer_config: Path | None, warn: Callable[[str], None] = print
) -> SeerConfig | None:
    """--seer/--no-seer and --seer-config for multimodal targets: the file given, else the checkpoint's seer.json."""
    if use_seer is False:
        return None
    if seer_config is not None:
        return SeerConfig.load(seer_config)
    found = checkpoint_seer(target)
    if found is None and use_seer:
        warn("warning: no calibrated Seer config for this checkpoint; using the built-in defaults "
             "(calibrate one for a safe margin)")
        return SeerConfig()
    return found


def generate_vl(
    target: str,
    texts: Sequence[str],
    images: Sequence[str | os.PathLike[str]],
    config: GenerationConfig,
    *,
    seer: SeerConfig | None = None,
    seed: int = 0,
) -> VlRun:
    """Answer `texts` about `images` with TARGET (checkpoint / 'demo-vl': torch; export directory: ONNX Runtime)."""
    per_prompt = assign_images(texts, images)
    pictures = [load_image(p) for paths in per_prompt for p in paths]  # clear errors before any model loads
    counts = [len(paths) for paths in per_prompt]
    if export_of(target) is not None:
        return _generate_ort(target, texts, per_prompt, pictures, counts, config, seer, seed)
    loaded = load_multimodal(target)
    tok = MultimodalTokenizer.for_checkpoint(loaded)
    vcfg, cfg = loaded.vision_config, loaded.config
    ids = [tok.encode_prompt(t) for t in texts]
    prompts = expand_placeholders(ids, counts, vcfg.tokens_per_image, vcfg.image_token_index, cfg.n_embed_rows)
    start = time.perf_counter()
    with torch.no_grad():
        embeds = loaded.vision(torch.from_numpy(pixel_batch(pictures, vcfg.image)))
    model = ImageConditionedModel(loaded.lm.model, image_table(list(embeds), cfg.d_model))
    result = generate(model, prompts, config, generator=torch.Generator().manual_seed(seed), seer=seer)
    seconds = time.perf_counter() - start
    reports: list[SeerReport | None] = list(result.seer) if result.seer else [None] * len(texts)
    answers = [
        VlAnswer(text, paths, tok.decode_answer(row.tolist()), row.tolist(), report)
        for text, paths, row, report in zip(texts, per_prompt, result.tokens, reports, strict=True)
    ]
    return VlRun(answers, "torch", result.steps_run, result.tokens_processed, seconds)


def _open_ort(target: str) -> MultimodalOrtBackend:
    """ONNX Runtime on a multimodal export dir, or on the export behind an ONNX Runtime engine dir with the engine's
    session settings, after the same compatibility check as text engines."""
    from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend
    from seer_deploy.runtime.targets import TargetOptions, checked_engine, engine_session_options

    if not is_engine_dir(target):
        return MultimodalOrtBackend(target)
    manifest, export_dir, _, _ = checked_engine(Path(target))
    if manifest.backend != "ort":
        raise ConfigError(f"TARGET '{target}' is a {manifest.backend} engine; multimodal generation runs on ONNX "
                          "Runtime: give the export directory or an ONNX Runtime engine dir built from it")
    return MultimodalOrtBackend(export_dir, engine_session_options(manifest, TargetOptions()))


def _generate_ort(
    target: str,
    texts: Sequence[str],
    per_prompt: list[list[str]],
    pictures: list[Image.Image],
    counts: list[int],
    config: GenerationConfig,
    seer: SeerConfig | None,
    seed: int,
) -> VlRun:
    from seer_deploy.models.image import ImageConfig
    from seer_deploy.runtime.loop import run_generation

    backend = _open_ort(target)
    cfg = backend.manifest.model_config()
    source = backend.manifest.model.source
    ckpt = resolve_multimodal(source)
    tok = MultimodalTokenizer(ckpt / "tokenizer.json", cfg.eos_id, cfg.eot_id, backend.image_token_index)
    vc = backend.multimodal["vision_config"]["image"]
    image_cfg = ImageConfig(int(vc["image_size"]), tuple(vc["mean"]), tuple(vc["std"]), str(vc["aspect"]))
    ids = [tok.encode_prompt(t) for t in texts]
    prompts = expand_placeholders(ids, counts, backend.tokens_per_image, backend.image_token_index, backend.image_id_base)
    start = time.perf_counter()
    embeds = backend.encode_images(pixel_batch(pictures, image_cfg))
    backend.set_image_table([embeds])
    pad = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    result = run_generation(
        backend, prompts, config, mask_id=cfg.mask_id, pad_id=pad, seed=seed, seer=seer, eos_id=cfg.eos_id
    )
    seconds = time.perf_counter() - start
    reports: list[SeerReport | None] = list(result.seer) if result.seer else [None] * len(texts)
    answers = [
        VlAnswer(text, paths, tok.decode_answer(row.tolist()), row.tolist(), report)
        for text, paths, row, report in zip(texts, per_prompt, result.tokens, reports, strict=True)
    ]
    return VlRun(answers, backend.name, result.steps_run, result.tokens_processed, seconds)


def demo_images(n: int, directory: Path) -> list[tuple[str, str, str]]:
    """Write n held-out demo-vl pictures as PNGs: (prompt, image path, expected answer) each."""
    from seer_deploy.models.demo_vl_tasks import heldout_examples

    out = []
    for i, ex in enumerate(heldout_examples(n)):
        file = directory / f"demo-vl-{i}.png"
        ex.image().save(file)
        out.append((ex.prompt, str(file), ex.answer))
    return out


def run_demo_vl(gen_length: int, n: int = 8, say: Callable[[str], None] = print,
                work_dir: Path | None = None) -> VlRun:
    """`seer-deploy demo --vl`: export demo-vl (vision.onnx, step0.onnx, step.onnx), answer n held-out pictures
    through ONNX Runtime with Seer (when calibrated), then the same pictures at full length for the comparison.

    The export goes to `work_dir` when given (kept afterwards), else to a temporary directory. Returns the Seer run.
    """
    from seer_deploy.export.multimodal import export_multimodal
    from seer_deploy.export.options import ExportOptions, SeerStats

    loaded = load_multimodal(DEMO_VL_NAME)
    seer = checkpoint_seer(DEMO_VL_NAME)
    n_params = loaded.lm.model.num_parameters() + loaded.vision.num_parameters()
    say(f"demo-vl checkpoint: {loaded.path} ({n_params / 1e6:.2f}M parameters, SigLIP tower + "
        f"{loaded.vision_config.projector_type} projector + LLaDA-style LM)")
    stats = SeerStats.for_config(seer)
    config = GenerationConfig(gen_length, gen_length)
    with tempfile.TemporaryDirectory(prefix="seer-deploy-demo-vl-") as tmp:
        root = work_dir if work_dir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        exported = export_multimodal(DEMO_VL_NAME, root / "demo-vl-onnx", ExportOptions(seer=stats))
        say(f"exported demo-vl to {exported.out} (vision.onnx, step0.onnx, step.onnx; checked against torch) in "
            f"{exported.seconds:.1f}s")
        cases = demo_images(n, root)
        texts, images = [c[0] for c in cases], [c[1] for c in cases]
        run = generate_vl(str(exported.out), texts, images, config, seer=seer)
        full = generate_vl(str(exported.out), texts, images, config, seer=None)
    for (prompt, _, expected), ans in zip(cases, run.answers, strict=True):
        mark = "ok" if ans.answer == expected else f"expected {expected}"
        kept = f"kept {ans.seer.kept:2d}/{gen_length}" if ans.seer is not None else ""
        say(f"  picture {Path(ans.images[0]).name:14s} {prompt:18s} -> {ans.answer:40s} {kept} [{mark}]")
    same = sum(a.answer == b.answer for a, b in zip(run.answers, full.answers, strict=True))
    seer_note = f"Seer ({seer.detector}, margin {seer.margin})" if seer is not None else "no calibrated Seer config"
    say(f"{len(cases)} pictures as one batch, gen_length {gen_length}, {run.backend}: {seer_note}: {run.steps_run} "
        f"passes, {run.tokens_processed} tokens processed, {run.seconds:.2f}s; full length: {full.steps_run} passes, "
        f"{full.tokens_processed} tokens, {full.seconds:.2f}s ({full.tokens_processed / run.tokens_processed:.1f}x "
        f"the tokens); {same} of {len(cases)} answers the same as full length's")
    return run


def echo_generate_vl(
    target: str,
    texts: Sequence[str],
    images: Sequence[str],
    config: GenerationConfig,
    *,
    seer: SeerConfig | None,
    seed: int,
    as_json: bool,
    say: Callable[[str], None] = print,
) -> VlRun:
    """The body of `seer-deploy generate TARGET --image PATH --prompt TEXT`: one line (or JSON object) per prompt."""
    run = generate_vl(target, texts, images, config, seer=seer, seed=seed)
    for ans in run.answers:
        if as_json:
            record: dict[str, object] = {"prompt": ans.prompt, "images": ans.images, "answer": ans.answer,
                                         "tokens": ans.tokens}
            if ans.seer is not None:
                record["seer"] = dataclasses.asdict(ans.seer)
            say(json.dumps(record))
        else:
            say(f"{ans.prompt} [{', '.join(Path(p).name for p in ans.images)}] -> {ans.answer}")
    return run
