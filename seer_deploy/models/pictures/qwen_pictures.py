"""Pictures -> patches, as Qwen2.5-VL's image processor makes them (Dimple uses it unchanged): resize so that both
sides are multiples of patch_size x merge_size (28 px) and the area lies within [min_pixels, max_pixels] (Qwen's
`smart_resize`), bicubic, scale to [0, 1], normalise with the processor's mean and std, and cut into patches of
3 x temporal_patch_size x 14 x 14 numbers (a still picture is repeated over the temporal patch), each 2 x 2 block of
patches contiguous. numpy and Pillow only, so an exported model's run needs neither torch nor transformers;
tests/test_dimple_pictures.py holds it equal to transformers' Qwen2VLImageProcessorPil.

Refused in one line (what Dimple's own processor refuses, and what the resizing rules cannot place): a side under
28 px, an aspect ratio above 200, an area above max_pixels after the resizing rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.models.pictures.image import to_rgb
from seer_deploy.models.pictures.mrope import picture_layout
from seer_deploy.models.pictures.qwen_layout import Grid, TowerGeometry, tokens_of, tower_inputs

CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)  # OPENAI_CLIP_MEAN, Qwen's default
CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT = 200  # Qwen's smart_resize refuses longer / shorter side above this


@dataclass(frozen=True)
class QwenPictureConfig:
    """Qwen2.5-VL's image processor settings (defaults: its processor's and Dimple's)."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    rescale: float = 1.0 / 255.0

    def __post_init__(self) -> None:
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels"):
            if not int_in(getattr(self, name), 1, 1 << 30):
                raise CheckpointError(f"preprocessor_config.json '{name}' is {getattr(self, name)!r}; it must be a "
                                      "positive integer; fix the image processor config")
        if self.min_pixels > self.max_pixels:
            raise CheckpointError(f"preprocessor_config.json min_pixels {self.min_pixels} exceeds max_pixels "
                                  f"{self.max_pixels}; fix the image processor config")
        for name, values, lo in (("image_mean", self.mean, -1e3), ("image_std", self.std, 0.0)):
            if len(values) != 3 or not all(number_in(v, lo, 1e3, above_lo=True) for v in values):
                raise CheckpointError(f"preprocessor_config.json {name} {list(values)!r} must be 3 finite numbers "
                                      "(R, G, B); fix the image processor config")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], tower: dict[str, Any] | None = None) -> QwenPictureConfig:
        """From a preprocessor_config.json (its `min_pixels` / `max_pixels`, or transformers 5's `size`
        {shortest_edge, longest_edge}); patch sizes default to the tower's."""
        size: dict[str, Any] = raw["size"] if isinstance(raw.get("size"), dict) else {}
        tower = tower or {}
        values: dict[str, Any] = {
            "patch_size": raw.get("patch_size", tower.get("patch_size", cls.patch_size)),
            "temporal_patch_size": raw.get("temporal_patch_size", tower.get("temporal_patch_size",
                                                                            cls.temporal_patch_size)),
            "merge_size": raw.get("merge_size", tower.get("spatial_merge_size", cls.merge_size)),
            "min_pixels": raw.get("min_pixels", size.get("shortest_edge", cls.min_pixels)),
            "max_pixels": raw.get("max_pixels", size.get("longest_edge", cls.max_pixels)),
            "mean": tuple(raw.get("image_mean", CLIP_MEAN)),
            "std": tuple(raw.get("image_std", CLIP_STD)),
        }
        if "rescale_factor" in raw:
            values["rescale"] = raw["rescale_factor"]
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {"patch_size": self.patch_size, "temporal_patch_size": self.temporal_patch_size,
                "merge_size": self.merge_size, "min_pixels": self.min_pixels, "max_pixels": self.max_pixels,
                "mean": list(self.mean), "std": list(self.std), "rescale": self.rescale}

    @property
    def factor(self) -> int:
        """Both sides of a resized picture are multiples of this (28 px)."""
        return self.patch_size * self.merge_size

    def resized(self, width: int, height: int, name: str = "the picture") -> tuple[int, int]:
        """(height, width) after Qwen's smart_resize, or ConfigError for a picture it cannot place."""
        factor = self.factor
        if width < factor or height < factor:
            raise ConfigError(f"{name} is {width} x {height} px; Dimple's vision tower needs at least {factor} px a "
                              "side; give a larger picture")
        if max(width, height) / min(width, height) > MAX_ASPECT:
            raise ConfigError(f"{name} is {width} x {height} px, an aspect ratio above {MAX_ASPECT}; crop it")
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            raise ConfigError(f"{name} ({width} x {height} px) resizes to {w_bar} x {h_bar} px, more than max_pixels "
                              f"{self.max_pixels} allows; crop it to a less elongated picture")
        return h_bar, w_bar

    @property
    def fewest_tokens(self) -> int:
        """The image tokens of the smallest picture (a square at min_pixels)."""
        side = max(self.factor, math.isqrt(self.min_pixels))
        return self.tokens(side, side)

    def grid(self, width: int, height: int, name: str = "the picture") -> Grid:
        """The picture's grid_thw in patches: (1, rows, columns)."""
        h, w = self.resized(width, height, name)
        return (1, h // self.patch_size, w // self.patch_size)

    def tokens(self, width: int, height: int, name: str = "the picture") -> int:
        """The image tokens the picture becomes in the prompt."""
        return tokens_of(self.grid(width, height, name), self.merge_size)

    def patches(self, picture: Image.Image, name: str = "the picture") -> tuple[np.ndarray, Grid]:
        """float32 [rows * columns, 3 * temporal_patch_size * patch_size**2] in the tower's patch order, and the grid."""
        h, w = self.resized(*picture.size, name)
        rgb = to_rgb(picture, name)
        if rgb.size != (w, h):
            rgb = rgb.resize((w, h), Image.Resampling.BICUBIC)
        scaled = np.asarray(rgb, dtype=np.float32) * np.float32(self.rescale)
        normed = (scaled - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)  # [h, w, 3]
        p, m = self.patch_size, self.merge_size
        rows, cols = h // p, w // p
        blocks = normed.transpose(2, 0, 1).reshape(3, rows // m, m, p, cols // m, m, p)
        blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)  # (block row, block col, row in block, col in block, C, p, p)
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], self.temporal_patch_size, p, p))
        return np.ascontiguousarray(frames.reshape(rows * cols, -1), dtype=np.float32), (1, rows, cols)


@dataclass(frozen=True)
class QwenPictures:
    """How a Dimple target takes pictures: the processor's settings, the tower's geometry (for the host-computed
    tower inputs) and the ids that enclose each picture's tokens (<|vision_start|>, <|vision_end|>)."""

    picture: QwenPictureConfig
    geometry: TowerGeometry
    marks: tuple[int, int]

    def encode(self, encode: Callable[[dict[str, np.ndarray]], np.ndarray], pictures: Sequence[Image.Image]
               ) -> tuple[list[np.ndarray], np.ndarray]:
        """Each picture's embeddings [tokens, D] from one call of a backend's `encode_patches` (the vision graph's
        inputs -> [all tokens, D]), and the pictures' M-RoPE layout (models.pictures.mrope.picture_layout)."""
        made = [self.picture.patches(p, f"picture {i + 1}") for i, p in enumerate(pictures)]
        grids = [grid for _, grid in made]
        layout = picture_layout(grids, self.geometry.merge_size)
        if not made:
            return [], layout
        embeds = np.asarray(encode(tower_inputs([patches for patches, _ in made], grids, self.geometry)))
        counts = [tokens_of(grid, self.geometry.merge_size) for grid in grids]
        return np.split(embeds, np.cumsum(counts)[:-1]), layout

    def to_dict(self) -> dict[str, Any]:
        g = self.geometry
        return {"picture": self.picture.to_dict(), "marks": list(self.marks),
                "geometry": {"patch_size": g.patch_size, "merge_size": g.merge_size, "window_size": g.window_size,
                             "head_dim": g.head_dim}}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> QwenPictures:
        """What `to_dict` wrote (an export manifest's record)."""
        picture = dict(raw["picture"])
        picture["mean"], picture["std"] = tuple(picture["mean"]), tuple(picture["std"])
        start, end = raw["marks"]
        return cls(QwenPictureConfig(**picture), TowerGeometry(**raw["geometry"]), (int(start), int(end)))
