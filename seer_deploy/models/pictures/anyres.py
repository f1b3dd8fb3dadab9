"""LaViDa's "anyres" pictures: a base view plus a grid of tower-sized crops, merged into one run of image tokens.

What LaViDa's public code does (llava/mm_utils.py process_anyres_image, llava_arch.py prepare_inputs_labels_for_
multimodal with image_aspect_ratio "anyres" and mm_patch_merge_type "spatial_unpad"), here in numpy and Pillow:
1. Pick the pinpoint resolution (width, height) that keeps the most of the picture's pixels once scaled to fit it,
   the least padding breaking ties (select_best_resolution).
2. Resize the picture to fit it, keeping the aspect ratio (the other side rounded up), centred on black; cut it into
   tower-sized crops, row by row. The base view is the whole picture resized to the tower's size (no padding).
3. Every view goes through the vision tower, projector and pooling (the vision graph, unchanged: one view per
   picture row of its batch). Of the base view the pooled patches are kept; the crops' pooled patches are laid out as
   one grid (rows of crops, each crop's rows of patches), the rows and columns that only covered padding are cut
   (unpad_image), and image_newline closes every row. Tokens: base (14 x 14) then the grid row by row.
So the number of image tokens depends on each picture's size (`anyres_tokens`), which the prompt's placeholders must
be expanded by (models.prompts.image_placeholders.expand_placeholders with one count per picture).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.models.pictures.image import ImageConfig, preprocess, to_rgb

MAX_CROPS = 64  # a pinpoint holds at most this many crops (LaViDa's largest: 3)


@dataclass(frozen=True)
class AnyresConfig:
    """The pinpoint resolutions (width, height), each a whole number of tower-sized crops per side."""

    pinpoints: tuple[tuple[int, int], ...]
    crop: int  # the tower's image size

    def to_dict(self) -> dict[str, Any]:
        """As an export manifest records it."""
        return {"pinpoints": [list(p) for p in self.pinpoints], "crop": self.crop}

    @classmethod
    def from_dict(cls, record: Any) -> AnyresConfig | None:
        """The tiling a manifest records (None: none); CheckpointError for a malformed record."""
        if record is None:
            return None
        try:
            return cls(tuple((int(w), int(h)) for w, h in record["pinpoints"]), int(record["crop"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"anyres record {record!r} is malformed ({exc}); re-export the model") from exc

    def __post_init__(self) -> None:
        if not self.pinpoints:
            raise CheckpointError("image_grid_pinpoints is empty; list the anyres resolutions as [[width, height], ...]")
        for w, h in self.pinpoints:
            if w % self.crop or h % self.crop or not 0 < (w // self.crop) * (h // self.crop) <= MAX_CROPS:
                raise CheckpointError(
                    f"image_grid_pinpoints entry [{w}, {h}] must be whole multiples of the tower's {self.crop} px "
                    f"(at most {MAX_CROPS} crops); fix config.json"
                )


def parse_pinpoints(value: Any, crop: int) -> AnyresConfig:
    """config.json's image_grid_pinpoints: a list of [w, h], its Python-literal string, or LLaVA's "(1x1),...,(3x3)"
    range of crop counts."""
    if isinstance(value, str) and "x" in value:
        found = re.findall(r"\((\d+)x(\d+)\)", value)
        if len(found) < 2:
            raise CheckpointError(f"image_grid_pinpoints {value!r} is not a '(AxB),...,(CxD)' range; fix config.json")
        (a, b), (c, d) = (tuple(map(int, found[0])), tuple(map(int, found[-1])))
        pairs: Any = [(i * crop, j * crop) for i in range(a, c + 1) for j in range(b, d + 1)]
    elif isinstance(value, str):
        try:
            pairs = ast.literal_eval(value)
        except (ValueError, SyntaxError) as exc:
            raise CheckpointError(f"image_grid_pinpoints {value!r} is not a list of [width, height]; fix config.json"
                                  ) from exc
    else:
        pairs = value
    if not isinstance(pairs, list | tuple) or not all(
            isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                for v in p) for p in pairs):
        raise CheckpointError(f"image_grid_pinpoints {value!r} must be a list of [width, height] integer pairs; "
                              "fix config.json")
    return AnyresConfig(tuple((int(w), int(h)) for w, h in pairs), crop)


def select_best_resolution(size: tuple[int, int], pinpoints: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The pinpoint that keeps the most of the picture's pixels once it is scaled to fit, the least waste on ties."""
    width, height = size
    best, most, least_waste = pinpoints[0], -1, math.inf
    for w, h in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - kept
        if kept > most or (kept == most and waste < least_waste):
            best, most, least_waste = (w, h), kept, waste
    return best


def grid_shape(size: tuple[int, int], cfg: AnyresConfig) -> tuple[int, int]:
    """(rows, columns) of crops for a picture of `size` (width, height)."""
    w, h = select_best_resolution(size, cfg.pinpoints)
    return h // cfg.crop, w // cfg.crop


def anyres_views(img: Image.Image, cfg: AnyresConfig) -> list[Image.Image]:
    """The base view (the picture resized to the crop size) and the crops of the fitted, padded picture, row-major."""
    rgb = to_rgb(img)
    target_w, target_h = select_best_resolution(rgb.size, cfg.pinpoints)
    width, height = rgb.size
    scale_w, scale_h = target_w / width, target_h / height  # the public code's float steps, so ceil agrees
    if scale_w < scale_h:
        new_w, new_h = target_w, min(math.ceil(height * scale_w), target_h)
    else:
        new_w, new_h = min(math.ceil(width * scale_h), target_w), target_h
    canvas = Image.new("RGB", (target_w, target_h), (0, 0, 0))
    canvas.paste(rgb.resize((new_w, new_h), Image.Resampling.BICUBIC), ((target_w - new_w) // 2,
                                                                         (target_h - new_h) // 2))
    crops = [canvas.crop((x, y, x + cfg.crop, y + cfg.crop))
             for y in range(0, target_h, cfg.crop) for x in range(0, target_w, cfg.crop)]
    return [rgb.resize((cfg.crop, cfg.crop), Image.Resampling.BICUBIC), *crops]


def anyres_pixels(img: Image.Image, cfg: AnyresConfig, image: ImageConfig) -> np.ndarray:
    """float32 [1 + rows * columns, 3, S, S]: the views, normalised as the tower expects (no further padding)."""
    if image.aspect != "square" or image.image_size != cfg.crop:
        raise ConfigError(f"anyres views are {cfg.crop} px squares resized as is; the image config must be 'square' "
                          f"at {cfg.crop} px, not '{image.aspect}' at {image.image_size}")
    return np.stack([preprocess(view, image) for view in anyres_views(img, cfg)])


def unpadded_grid(rows: int, cols: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the patch grid [rows, cols] that covers the picture, not the padding (LaViDa's
    unpad_image: the padded side loses (its length - the picture's scaled length) // 2 at each end)."""
    width, height = size
    if width / height > cols / rows:  # padding above and below
        pad = (rows - int(height * (cols / width))) // 2
        return pad, rows - pad, 0, cols
    pad = (cols - int(width * (rows / height))) // 2
    return 0, rows, pad, cols - pad


def anyres_tokens(size: tuple[int, int], cfg: AnyresConfig, side: int) -> int:
    """Image tokens of a picture of `size`: the base view's side * side, then the unpadded grid's rows, each with
    image_newline (side: the pooled patch grid's side of one view, 14 for LaViDa)."""
    rows, cols = grid_shape(size, cfg)
    top, bottom, left, right = unpadded_grid(rows * side, cols * side, size)
    return side * side + (bottom - top) * (right - left + 1)


def merge_views(embeds: np.ndarray, size: tuple[int, int], cfg: AnyresConfig) -> np.ndarray:
    """[tokens, D] of one picture from its views' embeddings [1 + rows * cols, side * side + 1, D], each view's last
    row being image_newline (the vision graph's output with spatial_unpad)."""
    rows, cols = grid_shape(size, cfg)
    views, per_view, width = embeds.shape
    side = math.isqrt(per_view - 1)
    if views != 1 + rows * cols or side * side != per_view - 1:
        raise ConfigError(f"anyres merge got {views} views of {per_view} tokens; a {size[0]} x {size[1]} picture "
                          f"needs {1 + rows * cols} views of a square patch grid + image_newline")
    newline = embeds[0, -1]
    grid = embeds[1:, :-1].reshape(rows, cols, side, side, width).transpose(0, 2, 1, 3, 4)
    grid = grid.reshape(rows * side, cols * side, width)
    top, bottom, left, right = unpadded_grid(rows * side, cols * side, size)
    grid = grid[top:bottom, left:right]
    lines = np.concatenate([grid, np.broadcast_to(newline, (grid.shape[0], 1, width))], axis=1)
    return np.concatenate([embeds[0, :-1], lines.reshape(-1, width)]).astype(embeds.dtype, copy=False)
