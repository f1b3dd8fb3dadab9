"""Image files -> the pixel tensors a SigLIP-family vision tower expects (LLaVA's preprocessing, with Pillow).

LLaVA-family checkpoints preprocess as follows: convert to RGB; with `image_aspect_ratio` "pad", pad the image to a
square with the mean colour, centred; resize to the tower's `image_size` (bicubic); scale to [0, 1]; normalise with
the image processor's mean and std. LLaVA's "anyres" tiling is refused here with a ConfigError naming the option;
LaViDa's own anyres tiling is models.pictures.anyres.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.core.files import os_error_fix

# Modes Pillow converts to RGB without guessing (palette, grey, alpha, CMYK, YCbCr). 16-bit, 32-bit integer and
# float modes (I, I;16, F, ...) have no agreed 8-bit mapping, so they are rejected rather than silently rescaled.
CONVERTIBLE_MODES: tuple[str, ...] = ("RGB", "RGBA", "L", "LA", "P", "PA", "1", "CMYK", "YCbCr", "RGBX", "La")
ASPECT_MODES: tuple[str, ...] = ("square", "pad")
# Images larger than this are refused from their header, before any pixel is decoded: a small file can declare
# gigapixels (a decompression bomb). 8192 x 8192 is far above what a vision tower's resize keeps.
MAX_IMAGE_PIXELS = 8192 * 8192
MAX_IMAGE_SIZE = 8192  # a tower's input side
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
        if not int_in(self.image_size, 1, MAX_IMAGE_SIZE):
            raise CheckpointError(
                f"image size {self.image_size!r} must be an integer from 1 to {MAX_IMAGE_SIZE}; fix the vision config"
            )
        for name, values, lo in (("image_mean", self.mean, -1e3), ("image_std", self.std, 0.0)):
            if len(values) != 3 or not all(number_in(v, lo, 1e3, above_lo=True) for v in values):
                raise CheckpointError(
                    f"{name} {list(values)!r} must be 3 finite numbers (R, G, B){' above 0' if lo == 0 else ''}; "
                    "fix the image config"
                )
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
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise _too_large(file, f"{width} x {height} pixels")
            img.load()
            return to_rgb(img, str(file))
    except Image.DecompressionBombError as exc:  # Pillow refuses twice its own limit before we see the size
        raise _too_large(file, str(exc).split(",")[0]) from exc
    except UnidentifiedImageError as exc:
        raise ConfigError(f"image '{file}' is not a readable image (Pillow cannot identify it); give a PNG or JPEG") from exc
    except OSError as exc:
        if exc.errno is not None:  # the OS refused (permissions, a vanished file), not a decoding failure
            raise ConfigError(f"image '{file}' cannot be opened ({exc.strerror}); {os_error_fix(exc)}") from exc
        raise ConfigError(f"image '{file}' could not be read ({exc}); the file may be truncated or corrupt") from exc
    except (ValueError, SyntaxError, EOFError, IndexError, struct.error) as exc:  # Pillow's decoders on bad data
        raise ConfigError(f"image '{file}' could not be read ({exc}); the file may be truncated or corrupt") from exc


def _too_large(file: Path, size: str) -> ConfigError:
    return ConfigError(
        f"image '{file}' is larger than the {MAX_IMAGE_PIXELS} pixels allowed ({size}); scale it down (the vision "
        "tower resizes it to a few hundred pixels anyway)"
    )


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
