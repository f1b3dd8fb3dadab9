"""Prompts with pictures, host side: `<image>` placeholders become image ids, pictures become an image table.

Each `<image>` placeholder becomes `tokens_per_image` ids at and above the embedding table's size (`id_base` =
ModelConfig.n_embed_rows); id `id_base + j` means row j of the image table (all images of the prompt set, in order,
one row per image token). Everything here is numpy and the tokenizer, what any backend's caller needs; the torch
side (the embedding lookup, the image-conditioned model) is `models.networks.image_prompts`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from seer_deploy.core.errors import ConfigError
from seer_deploy.models.checkpoints.multimodal_files import IMAGE_TOKEN
from seer_deploy.models.pictures.anyres import AnyresConfig, anyres_pixels, merge_views
from seer_deploy.models.pictures.image import ImageConfig, pixel_batch
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.models.text.tokenizer_files import TokenizerFacts

if TYPE_CHECKING:
    from seer_deploy.models.checkpoints.multimodal import LoadedMultimodal


class MultimodalTokenizer(Tokenizer):
    """A Tokenizer whose prompts may contain `<image>`: each becomes the placeholder id `image_token_index`."""

    def __init__(self, file: str | os.PathLike[str], eos_id: int, eot_id: int | None, image_token_index: int,
                 template: tuple[str | None, str] | None = None, *, described: TokenizerFacts | None = None) -> None:
        super().__init__(file, eos_id, eot_id, template=template, described=described)
        self.image_token_index = image_token_index
        # Checkpoints whose tokenizer lacks '<image>' (LLaVA splits the text on it instead) get it as a special token
        # here, so it is never split into pieces; its id is replaced by the placeholder below.
        if self._tok.token_to_id(IMAGE_TOKEN) is None:
            self._tok.add_special_tokens([IMAGE_TOKEN])
        self._image_id = self._tok.token_to_id(IMAGE_TOKEN)
        self._specials = [t for t in self._specials if t != IMAGE_TOKEN]  # the placeholder is meant to be typed

    @classmethod
    def for_checkpoint(cls, loaded: LoadedMultimodal) -> MultimodalTokenizer:
        cfg = loaded.config
        return cls(loaded.path / "tokenizer.json", cfg.eos_id, cfg.eot_id, loaded.vision_config.image_token_index)

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return [self.image_token_index if t == self._image_id else t for t in super()._ids(text, add_special_tokens)]


def count_placeholders(ids: Sequence[int], image_token_index: int) -> int:
    return sum(1 for t in ids if t == image_token_index)


def check_image_counts(prompts: Sequence[Sequence[int]], n_images: Sequence[int], image_token_index: int) -> None:
    """ConfigError when a prompt's `<image>` placeholders and its images differ in number."""
    if len(prompts) != len(n_images):
        raise ConfigError(f"{len(prompts)} prompts but image lists for {len(n_images)}; give one image list per prompt")
    for i, (ids, n) in enumerate(zip(prompts, n_images, strict=True)):
        k = count_placeholders(ids, image_token_index)
        if k != n:
            where = f"prompt {i + 1}" if len(prompts) > 1 else "the prompt"
            fix = (
                f"put '{IMAGE_TOKEN}' in the prompt once per image, where the image goes (e.g. '{IMAGE_TOKEN} what colours?')"
                if k < n
                else f"give one image per '{IMAGE_TOKEN}' (--image PATH, repeated) or remove the extra placeholders"
            )
            raise ConfigError(f"{where} has {k} {IMAGE_TOKEN} placeholder(s) but {n} image(s) were given; {fix}")


def expand_placeholders(
    prompts: Sequence[Sequence[int]], n_images: Sequence[int], tokens_per_image: int | Sequence[int],
    image_token_index: int, id_base: int
) -> list[list[int]]:
    """Replace each placeholder by its image's ids id_base + j (j counts the batch's image tokens): `tokens_per_image`
    for every image, or one count per image of the batch, in order (anyres pictures differ in size)."""
    check_image_counts(prompts, n_images, image_token_index)
    counts = [tokens_per_image] * sum(n_images) if isinstance(tokens_per_image, int) else list(tokens_per_image)
    if len(counts) != sum(n_images):
        raise ConfigError(f"{len(counts)} image token counts for {sum(n_images)} images; give one per image")
    out: list[list[int]] = []
    j, k = 0, 0
    for ids in prompts:
        row: list[int] = []
        for t in ids:
            if t == image_token_index:
                row.extend(range(id_base + j, id_base + j + counts[k]))
                j, k = j + counts[k], k + 1
            else:
                row.append(int(t))
        out.append(row)
    return out


def encode_pictures(encode: Callable[[np.ndarray], np.ndarray], pictures: Sequence[Image.Image], image: ImageConfig,
                    anyres: AnyresConfig | None = None) -> list[np.ndarray]:
    """Each picture's image embeddings [tokens, D] from a backend's `encode_images` (pixels [N, 3, S, S] -> [N, T, D]):
    one view each in one call, or with `anyres` (LaViDa) its views in one call per picture, merged
    (models.pictures.anyres.merge_views). The counts are what `expand_placeholders` takes."""
    if anyres is None:
        embeds = encode(pixel_batch(list(pictures), image)) if pictures else np.zeros((0, 1, 1), np.float32)
        return [np.asarray(e) for e in embeds]
    return [merge_views(np.asarray(encode(anyres_pixels(p, anyres, image))), p.size, anyres) for p in pictures]


def image_table_np(embeds: Sequence[np.ndarray], width: int, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """The numpy twin of `image_prompts.image_table` (what an exported graph's image_table input takes)."""
    rows = [np.asarray(e).reshape(-1, width) for e in embeds if np.asarray(e).size]
    if not rows:
        return np.zeros((1, width), dtype=dtype)
    return np.ascontiguousarray(np.concatenate(rows).astype(dtype, copy=False))
