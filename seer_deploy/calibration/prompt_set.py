"""Calibration prompts, text or with pictures, turned into what calibration runs on: a model and prompt ids.

A prompts file holds JSON lines {"prompt": ..., "image": PATH or [PATH, ...]} (one image per `<image>` placeholder,
in order; a relative path is relative to the file) or plain text lines. For a multimodal checkpoint the vision tower
encodes every picture of the set once, into one image table: `expand_placeholders` numbers the image ids across the
whole prompt list, so a single ImageConditionedModel over that table serves every batch, and the calibration code (a
MaskPredictor on prompt ids, the torch reference loop) runs on it unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.files import read_text
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoint import load_checkpoint
from seer_deploy.models.image import load_image, pixel_batch
from seer_deploy.models.image_prompts import (
    ImageConditionedModel,
    MultimodalTokenizer,
    expand_placeholders,
    image_table,
)
from seer_deploy.models.llada import MaskPredictor
from seer_deploy.models.multimodal import IMAGE_TOKEN, is_multimodal_checkpoint, load_multimodal
from seer_deploy.models.tokenizer import Tokenizer, check_prompt
from seer_deploy.models.vision import VisionEncoder

ImageSource = str | os.PathLike[str] | Image.Image  # a picture's file, or the picture itself


@dataclass(frozen=True, eq=False)
class CalibrationPrompt:
    """One calibration prompt and its pictures in `<image>` order; `where` names it in error messages."""

    text: str
    images: tuple[ImageSource, ...] = ()
    where: str = "prompt"


@dataclass
class PreparedPrompts:
    """What calibrate_model runs on: the checkpoint's language model, or an ImageConditionedModel holding every
    picture of the set, and the prompt ids (image ids included, indexing that model's image table)."""

    model: MaskPredictor
    ids: list[list[int]]
    n_images: int = 0


def read_calibration_prompts(file: Path) -> list[CalibrationPrompt]:
    """The prompts of a JSON-lines (or plain-text) file; ConfigError naming the line for a malformed one."""
    lines = enumerate(read_text(file, "prompts file").splitlines(), start=1)
    prompts = [parse_prompt_line(line, f"{file}:{n}", file.parent) for n, line in lines if line.strip()]
    if not prompts:
        raise ConfigError(f"{file} holds no prompt; give one JSON object {{\"prompt\": ...}} or one prompt per line")
    return prompts


def parse_prompt_line(line: str, where: str, base: Path) -> CalibrationPrompt:
    """A plain line is a text prompt; a JSON object gives 'prompt' and optionally 'image' (paths relative to base)."""
    if not line.lstrip().startswith("{"):
        return CalibrationPrompt(check_prompt(line, where), where=where)
    try:
        record = json.loads(line)
        text = str(record["prompt"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: expected {{\"prompt\": \"...\", \"image\": \"PATH\"}} ({exc})") from exc
    field = record.get("image", [])
    paths = [field] if isinstance(field, str) else field
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ConfigError(f"{where}: 'image' must be a path or a list of paths, one per {IMAGE_TOKEN} in the prompt")
    return CalibrationPrompt(check_prompt(text, where), tuple(base / Path(p).expanduser() for p in paths), where)


def check_prompt_images(prompts: Sequence[CalibrationPrompt], target: str, multimodal: bool) -> None:
    """ConfigError, before any model loads, for images given to a text checkpoint, a prompt whose `<image>`
    placeholders and images differ in number, or an image file that cannot be read."""
    for prompt in prompts:
        if prompt.images and not multimodal:
            raise ConfigError(f"{prompt.where}: gives an image, but '{target}' is a text checkpoint; drop the 'image' "
                              "field or calibrate a multimodal checkpoint (demo-vl, a LLaDA-V-layout directory)")
        placeholders = prompt.text.count(IMAGE_TOKEN)
        if multimodal and placeholders != len(prompt.images):
            raise ConfigError(f"{prompt.where}: {placeholders} {IMAGE_TOKEN} placeholder(s) but {len(prompt.images)} "
                              f"image(s); give one image per {IMAGE_TOKEN} in the prompt, in order")
        for source in prompt.images:
            try:
                picture(source)
            except ConfigError as exc:
                raise ConfigError(f"{prompt.where}: {exc}") from exc


def picture(source: ImageSource) -> Image.Image:
    """The picture itself, or read in full from its file (so a bad file fails here, in one line)."""
    return source if isinstance(source, Image.Image) else load_image(source)


def prepare_prompts(target: str, prompts: Sequence[CalibrationPrompt], config: GenerationConfig,
                    batch_size: int = 64) -> PreparedPrompts:
    """Check `prompts` against TARGET (a text or multimodal checkpoint, 'demo', 'demo-vl'), then load it and turn
    them into ids, encoding their pictures once; every input error comes before any model runs."""
    multimodal = is_multimodal_checkpoint(target)
    check_prompt_images(prompts, target, multimodal)
    if multimodal:
        loaded = load_multimodal(target)
        tokenizer = MultimodalTokenizer.for_checkpoint(loaded)
        return prepare_image_prompts(loaded.lm.model, loaded.vision, tokenizer, prompts, config, batch_size)
    ckpt = load_checkpoint(target)
    text_tokenizer = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id, ckpt.config.eot_id)
    ids = [text_tokenizer.encode_prompt(p.text) for p in prompts]
    config.validate(ckpt.config.max_seq_len, max((len(p) for p in ids), default=0))
    return PreparedPrompts(ckpt.model, ids)


@torch.no_grad()
def prepare_image_prompts(lm: MaskPredictor, vision: VisionEncoder, tokenizer: MultimodalTokenizer,
                          prompts: Sequence[CalibrationPrompt], config: GenerationConfig,
                          batch_size: int = 64) -> PreparedPrompts:
    """Prompts with pictures -> ids whose image ids index one table of every picture, and `lm` holding that table.

    The prompt lengths (image tokens included) are checked against the model before the vision tower runs, which
    encodes `batch_size` pictures at a time.
    """
    vcfg = vision.cfg
    ids = expand_placeholders([tokenizer.encode_prompt(p.text) for p in prompts], [len(p.images) for p in prompts],
                              vcfg.tokens_per_image, vcfg.image_token_index, lm.cfg.n_embed_rows)
    config.validate(lm.cfg.max_seq_len, max((len(p) for p in ids), default=0))
    sources = [source for p in prompts for source in p.images]
    embeds = [vision(torch.from_numpy(pixel_batch([picture(s) for s in sources[lo : lo + batch_size]], vcfg.image)))
              for lo in range(0, len(sources), batch_size)]
    return PreparedPrompts(ImageConditionedModel(lm, image_table(embeds, lm.cfg.d_model)), ids, len(sources))
