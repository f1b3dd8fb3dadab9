"""The bench's multimodal workload (`seer-deploy bench demo-vl`): the same rows on held-out demo-vl pictures.

Each picture is encoded once, before any timing, by each engine's own vision tower (torch's for the torch rows,
vision.onnx for the ONNX Runtime rows): the tower runs once per request whatever the row, so the rows differ only in
the denoising loop, the part Seer changes. Image ids in the prompts index one table that holds every bench picture,
so any batch the rows form reads its own pictures' embeddings.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from seer_deploy.bench.harness import BenchSettings, Prepared, Progress
from seer_deploy.core.backend import Backend
from seer_deploy.core.errors import ConfigError
from seer_deploy.runtime.targets import TargetInfo


def prepare_vl_bench(settings: BenchSettings, work_dir: Path, say: Progress = lambda _: None) -> Prepared:
    """Open a multimodal checkpoint, encode the bench's pictures, export once and open ONNX Runtime on the export."""
    from seer_deploy.cli.vl import checkpoint_seer
    from seer_deploy.engines.ort import OrtSessionOptions
    from seer_deploy.engines.ort_multimodal import MultimodalOrtBackend
    from seer_deploy.export.multimodal import export_multimodal
    from seer_deploy.export.options import ExportOptions, SeerStats
    from seer_deploy.models.demo_vl_tasks import heldout_examples
    from seer_deploy.models.image import pixel_batch
    from seer_deploy.models.image_prompts import (
        ImageConditionedModel,
        MultimodalTokenizer,
        expand_placeholders,
        image_table,
    )
    from seer_deploy.models.multimodal import load_multimodal
    from seer_deploy.runtime.torch_backend import TorchBackend
    from seer_deploy.seer.config import SeerConfig

    settings.validate()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    say(f"loading {settings.target}")
    loaded = load_multimodal(settings.target)
    cfg, vcfg = loaded.config, loaded.vision_config
    tokenizer = MultimodalTokenizer.for_checkpoint(loaded)
    notes = [("multimodal workload: each picture is encoded once before timing by the row's own vision tower "
              "(torch or vision.onnx); the timings are the denoising loop's")]
    calibrated = checkpoint_seer(settings.target)
    seer = calibrated if calibrated is not None else SeerConfig()
    if calibrated is None:
        notes.append(f"no calibrated Seer config (seer.json) in {settings.target}: Seer ran with the built-in "
                     f"defaults ({seer.detector} detector, margin {seer.margin}); `seer-deploy calibrate` takes text "
                     "prompts only, so calibrate with seer.calibrate.calibrate_model on image prompts, as "
                     "scripts/train_demo_vl.py does, and save the config as the checkpoint's seer.json")
    examples = heldout_examples(settings.prompts)
    ids = [tokenizer.encode_prompt(e.prompt) for e in examples]
    prompts = expand_placeholders(ids, [1] * len(ids), vcfg.tokens_per_image, vcfg.image_token_index,
                                  cfg.n_embed_rows)
    longest = max(len(p) for p in prompts) + max(settings.gen_lengths)
    if longest > cfg.max_seq_len:
        raise ConfigError(
            f"the longest prompt ({max(len(p) for p in prompts)} tokens, its picture's {vcfg.tokens_per_image} image "
            f"tokens included) + gen_length {max(settings.gen_lengths)} = {longest} exceeds the model's "
            f"{cfg.max_seq_len} positions; lower --gen-lengths (demo-vl: at most 64)"
        )
    pixels = pixel_batch([e.image() for e in examples], vcfg.image)
    with torch.no_grad():
        embeds = loaded.vision(torch.from_numpy(pixels))
    model = ImageConditionedModel(loaded.lm.model, image_table(list(embeds), cfg.d_model))

    say(f"exporting {settings.target} to ONNX (once for this run)")
    start = time.perf_counter()
    export = export_multimodal(settings.target, work_dir / "export", ExportOptions(seer=SeerStats.for_config(seer)))
    export_seconds = time.perf_counter() - start
    ort_backend = MultimodalOrtBackend(export.out, OrtSessionOptions(intra_op_threads=settings.threads))
    ort_backend.set_image_table([ort_backend.encode_images(pixels)])

    pad = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    info = TargetInfo(target=settings.target, kind="checkpoint", backend="torch", path=loaded.path, config=cfg,
                      mask_id=cfg.mask_id, eos_id=cfg.eos_id, pad_id=pad, eot_id=cfg.eot_id,
                      tokenizer_file=loaded.path / "tokenizer.json", checkpoint=settings.target)
    ort_info = TargetInfo(target=str(export.out), kind="export", backend="ort", path=export.out, config=cfg,
                          mask_id=cfg.mask_id, eos_id=cfg.eos_id, pad_id=pad, eot_id=cfg.eot_id,
                          tokenizer_file=loaded.path / "tokenizer.json", checkpoint=settings.target,
                          export_dir=export.out)
    backends: dict[str, tuple[Backend, TargetInfo]] = {"ort": (ort_backend, ort_info),
                "torch-seer": (TorchBackend(model, seer.stats_spec(cfg.n_layers)), info)}
    why = ("not asked for (--no-tensorrt)" if not settings.tensorrt
           else "the TensorRT profiles do not cover the multimodal step graphs' image-table input (build refuses it)")
    skipped = [{"row": name, "why": why} for name in ("trt-full", "trt-seer")]
    facts = {"vision_parameters": loaded.vision.num_parameters(), "tokens_per_image": vcfg.tokens_per_image,
             "image_size": vcfg.image.image_size}
    return Prepared(settings, model, info, tokenizer, seer, "calibrated" if calibrated is not None else "defaults",
                    list(examples), prompts, backends, export_seconds, skipped, notes, work_dir, facts,
                    workload="held-out demo-vl pictures (tasks in rotation)")
