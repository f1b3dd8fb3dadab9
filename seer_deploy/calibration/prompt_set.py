"""Calibration prompts, text or with pictures, turned into what calibration runs on: a model and prompt ids.

The prompts are requests, as `generate` takes them (a prompts file: `models.requests.read_prompts_file`). For a
multimodal checkpoint the vision tower
encodes every picture of the set once, into one image table: `expand_placeholders` numbers the image ids across the
whole prompt list, so a single ImageConditionedModel over that table serves every batch, and the calibration code (a
MaskPredictor on prompt ids, the torch reference loop) runs on it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from PIL import Image

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoint import load_checkpoint
from seer_deploy.models.image import pixel_batch
from seer_deploy.models.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.models.image_prompts import ImageConditionedModel, image_table
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.models.multimodal import load_multimodal
from seer_deploy.models.multimodal_files import is_multimodal_checkpoint
from seer_deploy.models.requests import Request, check_request_images, load_pictures
from seer_deploy.models.tokenizer import Tokenizer
from seer_deploy.models.vision import VisionEncoder


@dataclass
class PreparedPrompts:
    """What calibrate_model runs on: the checkpoint's language model, or an ImageConditionedModel holding every
    picture of the set, and the prompt ids (image ids included, indexing that model's image table)."""

    model: MaskPredictor
    ids: list[list[int]]
    n_images: int = 0


def prepare_prompts(target: str, prompts: Sequence[Request], config: GenerationConfig,
                    batch_size: int = 64) -> PreparedPrompts:
    """Check `prompts` against TARGET (a text or multimodal checkpoint, 'demo', 'demo-vl'), then load it and turn
    them into ids, encoding their pictures once; every input error comes before any model runs."""
    multimodal = is_multimodal_checkpoint(target)
    check_request_images(prompts, target, multimodal)
    pictures = load_pictures(prompts)
    if multimodal:
        loaded = load_multimodal(target)
        tokenizer = MultimodalTokenizer.for_checkpoint(loaded)
        return prepare_image_prompts(loaded.lm.model, loaded.vision, tokenizer, prompts, config, batch_size, pictures)
    ckpt = load_checkpoint(target)
    text_tokenizer = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id, ckpt.config.eot_id)
    ids = [text_tokenizer.encode_prompt(p.prompt) for p in prompts]
    config.validate(ckpt.config.max_seq_len, max((len(p) for p in ids), default=0))
    return PreparedPrompts(ckpt.model, ids)


@torch.no_grad()
def prepare_image_prompts(lm: MaskPredictor, vision: VisionEncoder, tokenizer: MultimodalTokenizer,
                          prompts: Sequence[Request], config: GenerationConfig, batch_size: int = 64,
                          pictures: Sequence[Sequence[Image.Image]] | None = None) -> PreparedPrompts:
    """Prompts with pictures -> ids whose image ids index one table of every picture, and `lm` holding that table.

    The prompt lengths (image tokens included) are checked against the model before the vision tower runs, which
    encodes `batch_size` pictures at a time.
    """
    vcfg = vision.cfg
    ids = expand_placeholders([tokenizer.encode_prompt(p.prompt) for p in prompts], [len(p.images) for p in prompts],
                              vcfg.tokens_per_image, vcfg.image_token_index, lm.cfg.n_embed_rows)
    config.validate(lm.cfg.max_seq_len, max((len(p) for p in ids), default=0))
    flat = [p for per_prompt in (pictures if pictures is not None else load_pictures(prompts)) for p in per_prompt]
    embeds = [vision(torch.from_numpy(pixel_batch(list(flat[lo : lo + batch_size]), vcfg.image)))
              for lo in range(0, len(flat), batch_size)]
    return PreparedPrompts(ImageConditionedModel(lm, image_table(embeds, lm.cfg.d_model)), ids, len(flat))
