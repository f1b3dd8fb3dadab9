"""Calibration prompts, text or with pictures, turned into what calibration runs on: an answer source
(`calibration.sources`: a checkpoint's torch model, or an export's backend) and prompt ids.

The prompts are requests, as `generate` takes them (a prompts file: `models.prompts.prompt.read_prompts_file`). For a
multimodal target the vision tower (the checkpoint's, or the export's vision graph) encodes every picture of the set
once, into one image table: `expand_placeholders` numbers the image ids across the whole prompt list, so a single
table serves every batch (an ImageConditionedModel over it, or the export backend's image table), and the
calibration code runs on it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from seer_deploy.calibration.sources import AnswerSource, BackendSource, TorchSource
from seer_deploy.contracts.export_manifest import MANIFEST_FILE as EXPORT_FILE
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.engines.manifest import MANIFEST_FILE as ENGINE_FILE
from seer_deploy.engines.manifest import EngineManifest
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.checkpoints.multimodal import load_multimodal
from seer_deploy.models.checkpoints.multimodal_files import is_dimple_checkpoint, is_multimodal_checkpoint
from seer_deploy.models.networks.image_prompts import ImageConditionedModel, image_table
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.vision import VisionEncoder
from seer_deploy.models.pictures.image import pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.models.prompts.prompt import Prompt, check_prompt_images, load_pictures
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.openers import open_target
from seer_deploy.runtime.targets import Description, TargetOptions, describe, engine_export_dir


@dataclass
class PreparedPrompts:
    """What calibrate_model runs on: the source of step zero and answers (a checkpoint's language model, or an
    ImageConditionedModel holding every picture of the set; an export's backend holding them in its image table),
    and the prompt ids (image ids included, indexing that table)."""

    source: AnswerSource
    ids: list[list[int]]
    n_images: int = 0

    @property
    def model(self) -> MaskPredictor:
        """A checkpoint's torch model, for code that runs the reference loop on it directly; an export has none."""
        if not isinstance(self.source, TorchSource):
            raise ConfigError("these prompts run on an export, which has no torch model; use its source")
        return self.source.model


def prepare_prompts(target: str, prompts: Sequence[Prompt], config: GenerationConfig,
                    batch_size: int = 64, threads: int | None = None) -> PreparedPrompts:
    """Check `prompts` against TARGET (a text or multimodal checkpoint, 'demo', 'demo-vl', or an export directory of
    one), then load it and turn them into ids, encoding their pictures once; every input error comes before any model
    runs. `threads`: ONNX Runtime's intra-op threads for an export (default: its own)."""
    path = Path(target).expanduser()
    if (path / ENGINE_FILE).is_file():
        raise ConfigError(f"TARGET '{target}' is an engine directory; calibrate the export it was built from "
                          f"({engine_export_dir(path, EngineManifest.load(path))}): the engine runs its graphs")
    if (path / EXPORT_FILE).is_file():
        return prepare_export_prompts(describe(target), prompts, config, batch_size, threads)
    multimodal = is_multimodal_checkpoint(target)
    check_prompt_images(prompts, target, multimodal)
    dimple = is_dimple_checkpoint(target)
    if dimple and any(p.images for p in prompts):
        raise ConfigError(f"calibrating a Dimple checkpoint on prompts with pictures is not implemented; export it "
                          f"(seer-deploy export {target} --out DIR) and calibrate the export, which runs the same "
                          "pictures")
    pictures = load_pictures(prompts)
    if multimodal and not dimple:  # a Dimple checkpoint without pictures: its language model, as Dream's
        loaded = load_multimodal(target)
        tokenizer = MultimodalTokenizer.for_checkpoint(loaded)
        return prepare_image_prompts(loaded.lm.model, loaded.vision, tokenizer, prompts, config, batch_size, pictures)
    ckpt = load_checkpoint(target)
    text_tokenizer = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id, ckpt.config.eot_id)
    ids = [text_tokenizer.encode_prompt(p.prompt) for p in prompts]
    config.check_fits(ckpt.config.max_seq_len, max((len(p) for p in ids), default=0))
    return PreparedPrompts(TorchSource(ckpt.model), ids)


def prepare_export_prompts(described: Description, prompts: Sequence[Prompt], config: GenerationConfig,
                           batch_size: int = 64, threads: int | None = None) -> PreparedPrompts:
    """An export opened on ONNX Runtime, its own tokenizer's ids, and its vision graph's embeddings of every picture
    set once as its image table (ids numbered across the whole set, as a service numbers a batch's). The prompt
    lengths, their pictures' tokens included, are checked before the vision graph runs."""
    assert described.export is not None  # describe() reads an export dir's manifest
    backend, info = open_target(described.target, TargetOptions(backend="ort", threads=threads), described)
    check_prompt_images(prompts, described.target, info.images is not None)
    pictures = load_pictures(prompts)
    ids = [info.tokenizer().encode_prompt(p.prompt) for p in prompts]
    images = info.images
    extra = [0 if images is None else sum(images.picture_tokens(p) - 1 for p in per_prompt) for per_prompt in pictures]
    config.check_fits(backend.max_seq_len, max((len(p) + n for p, n in zip(ids, extra, strict=True)), default=0))
    flat = [p for per_prompt in pictures for p in per_prompt]
    if images is not None:
        tokens = images.set_pictures(backend, flat, per_call=batch_size)
        ids = expand_placeholders(ids, [len(p) for p in pictures], tokens, images.image_token_index, images.id_base)
    seer = described.export.seer
    return PreparedPrompts(BackendSource(backend, info.config, (seer.abs_threshold, seer.rel_threshold), info.mask_id,
                                         info.pad_id, info.eos_id), ids, len(flat))


@torch.no_grad()
def prepare_image_prompts(lm: MaskPredictor, vision: VisionEncoder, tokenizer: MultimodalTokenizer,
                          prompts: Sequence[Prompt], config: GenerationConfig, batch_size: int = 64,
                          pictures: Sequence[Sequence[Image.Image]] | None = None) -> PreparedPrompts:
    """Prompts with pictures -> ids whose image ids index one table of every picture, and `lm` holding that table.

    The prompt lengths (image tokens included) are checked against the model before the vision tower runs, which
    encodes `batch_size` pictures at a time.
    """
    vcfg = vision.cfg
    ids = expand_placeholders([tokenizer.encode_prompt(p.prompt) for p in prompts], [len(p.images) for p in prompts],
                              vcfg.tokens_per_image, vcfg.image_token_index, lm.cfg.n_embed_rows)
    config.check_fits(lm.cfg.max_seq_len, max((len(p) for p in ids), default=0))
    flat = [p for per_prompt in (pictures if pictures is not None else load_pictures(prompts)) for p in per_prompt]
    embeds = [vision(torch.from_numpy(pixel_batch(list(flat[lo : lo + batch_size]), vcfg.image)))
              for lo in range(0, len(flat), batch_size)]
    return PreparedPrompts(TorchSource(ImageConditionedModel(lm, image_table(embeds, lm.cfg.d_model))), ids, len(flat))
