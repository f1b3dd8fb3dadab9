"""Image files -> the pixel tensors a SigLIP-family vision tower expects (LLaVA's preprocessing, with Pillow).

LLaVA-family checkpoints preprocess as follows: convert to RGB; with `image_aspect_ratio` "pad", pad the image to a
square with the mean colour, centred; resize to the tower's `image_size` (bicubic); scale to [0, 1]; normalise with
the image processor's mean and std. "anyres" tiling is not implemented: it raises a ConfigError naming the option.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from seer_deploy.core.errors import CheckpointError, ConfigError

# Modes Pillow converts to RGB without guessing (palette, grey, alpha, CMYK, YCbCr). 16-bit, 32-bit integer and
# float modes (I, I;16, F, ...) have no agreed 8-bit mapping, so they are rejected rather than silently rescaled.
CONVERTIBLE_MODES: tuple[str, ...] = ("RGB", "RGBA", "L", "LA", "P", "PA", "1", "CMYK", "YCbCr", "RGBX", "La")
ASPECT_MODES: tuple[str, ...] = ("square", "pad")
SIGLIP_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
SIGLIP_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ImageConfig:
    """How images are turned into pixel tensors: size, normalisation, aspect-ratio handling."""

    image_size: int
    mean: tuple[float, float, float] = SIGLIP_MEAN
    std: tuple[float, float, float] = SIGLIP_STD
    aspect: str = "square"  # "square": resize as is; "pad": pad to a square with the mean colour first
    rescale: float = 1.0 / 255.0

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise CheckpointError(f"image size {self.image_size} must be positive; fix the vision config")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise CheckpointError("image_mean and image_std must have 3 values (R, G, B); fix the image config")
        if any(s <= 0 for s in self.std):
            raise CheckpointError(f"image_std {self.std} must be positive; fix the image config")
        check_aspect(self.aspect)


def check_aspect(aspect: str) -> None:
    """Accept LLaVA's 'square'/'pad'; name the unsupported options (anyres tiling) with the fix."""
    if aspect in ASPECT_MODES:
        return
    if aspect.startswith("anyres"):
        raise ConfigError(
            f"image_aspect_ratio '{aspect}' (LLaVA 'anyres' tiling into several crops) is not supported; set "
            "\"image_aspect_ratio\": \"pad\" in the checkpoint's config.json to encode each image as one "
            "base-resolution crop"
        )
    raise ConfigError(
        f"image_aspect_ratio '{aspect}' is unknown; use one of {', '.join(ASPECT_MODES)} in the checkpoint's config.json"
    )


def load_image(path: str | os.PathLike[str]) -> Image.Image:
    """Open an image file fully (so errors surface here, not later) and convert it to RGB."""
    file = Path(path)
    if not file.exists():
        raise ConfigError(f"image '{file}' does not exist; give the path of a PNG, JPEG or other image file")
    if not file.is_file():
        raise ConfigError(f"image '{file}' is not a file; give the path of a PNG, JPEG or other image file")
    try:
        with Image.open(file) as img:
            img.load()
            return to_rgb(img, str(file))
    except UnidentifiedImageError as exc:
        raise ConfigError(f"image '{file}' is not a readable image (Pillow cannot identify it); give a PNG or JPEG") from exc
    except (OSError, ValueError, SyntaxError) as exc:
        raise ConfigError(f"image '{file}' could not be read ({exc}); the file may be truncated or corrupt") from exc


def to_rgb(img: Image.Image, name: str = "image") -> Image.Image:
    """RGB copy of `img`; transparent pixels are composited on white (as LLaVA's convert_to_rgb does)."""
    if img.mode not in CONVERTIBLE_MODES:
        raise ConfigError(
            f"{name} has Pillow mode '{img.mode}' (16-bit, 32-bit or float samples), which is not supported; "
            "save it as an 8-bit RGB or greyscale PNG/JPEG"
        )
    if img.mode == "RGB":
        return img.copy()
    if img.mode in ("RGBA", "LA", "PA", "La") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def expand_to_square(img: Image.Image, fill: tuple[int, int, int]) -> Image.Image:
    """Pad the shorter side so the image is square, centred, with `fill` (LLaVA's expand2square)."""
    w, h = img.size
    if w == h:
        return img
    side = max(w, h)
    out = Image.new("RGB", (side, side), fill)
    out.paste(img, ((side - w) // 2, (side - h) // 2))
    return out


def preprocess(img: Image.Image, cfg: ImageConfig) -> np.ndarray:
    """float32 [3, image_size, image_size]: (rgb / 255 - mean) / std after padding (aspect 'pad') and resizing."""
    rgb = to_rgb(img)
    if cfg.aspect == "pad":
        fill = (int(cfg.mean[0] * 255), int(cfg.mean[1] * 255), int(cfg.mean[2] * 255))  # LLaVA truncates
        rgb = expand_to_square(rgb, fill)
    size = (cfg.image_size, cfg.image_size)
    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    scaled: np.ndarray = np.asarray(rgb, dtype=np.float32) * np.float32(cfg.rescale)
    normed: np.ndarray = (scaled - np.asarray(cfg.mean, dtype=np.float32)) / np.asarray(cfg.std, dtype=np.float32)
    return np.ascontiguousarray(normed.transpose(2, 0, 1), dtype=np.float32)


def pixel_batch(images: list[Image.Image], cfg: ImageConfig) -> np.ndarray:
    """float32 [N, 3, H, W] for a list of images (N may be 0)."""
    if not images:
        return np.zeros((0, 3, cfg.image_size, cfg.image_size), dtype=np.float32)
    return np.stack([preprocess(img, cfg) for img in images])
