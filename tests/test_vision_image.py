"""Image files -> pixel tensors: conversion, padding, resizing, normalisation, and the errors for bad images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from seer_deploy.core.errors import ConfigError
from seer_deploy.models.image import ImageConfig, expand_to_square, load_image, preprocess


def test_normalisation_uses_the_configs_mean_and_std() -> None:
    white = Image.new("RGB", (8, 8), (255, 255, 255))
    black = Image.new("RGB", (8, 8), (0, 0, 0))
    cfg = ImageConfig(8, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert np.allclose(preprocess(white, cfg), 1.0) and np.allclose(preprocess(black, cfg), -1.0)
    clip = ImageConfig(8, mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))
    out = preprocess(white, clip)
    assert out.shape == (3, 8, 8)
    assert np.allclose(out[:, 0, 0], (1 - np.array(clip.mean)) / np.array(clip.std), atol=1e-6)


def test_pad_mode_pads_to_a_square_with_the_mean_colour_then_resizes() -> None:
    wide = Image.new("RGB", (40, 20), (255, 0, 0))
    square = expand_to_square(wide, (127, 127, 127))
    assert square.size == (40, 40)
    arr = np.asarray(square)
    assert tuple(arr[0, 0]) == (127, 127, 127) and tuple(arr[20, 20]) == (255, 0, 0)
    assert tuple(arr[9, 20]) == (127, 127, 127) and tuple(arr[10, 20]) == (255, 0, 0)  # centred: 10 rows on top
    out = preprocess(wide, ImageConfig(16, aspect="pad"))
    assert out.shape == (3, 16, 16)
    assert np.allclose(out[:, 0, 8], 127 / 255 * 2 - 1, atol=1e-6)  # padding (LLaVA truncates 0.5 * 255 to 127)
    assert np.allclose(out[:, 8, 8], [1.0, -1.0, -1.0], atol=1e-6)  # the red picture in the middle
    squashed = preprocess(wide, ImageConfig(16, aspect="square"))
    assert np.allclose(squashed[:, 0, 8], [1.0, -1.0, -1.0], atol=1e-6)  # no padding: red to the edge


def test_modes_convert_to_rgb(tmp_path: Path) -> None:
    grey = Image.new("L", (4, 4), 255)
    assert np.allclose(preprocess(grey, ImageConfig(4)), 1.0)
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))  # fully transparent: composited on white
    assert np.allclose(preprocess(rgba, ImageConfig(4)), 1.0)
    pal = Image.new("RGB", (4, 4), (255, 0, 0)).convert("P")
    pal.save(tmp_path / "p.png")
    img = load_image(tmp_path / "p.png")
    assert img.mode == "RGB" and img.getpixel((1, 1)) == (255, 0, 0)


def test_missing_image(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"image '.*nope\.png' does not exist"):
        load_image(tmp_path / "nope.png")
    with pytest.raises(ConfigError, match="is not a file"):
        load_image(tmp_path)


def test_unreadable_image(tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_text("not a picture")
    with pytest.raises(ConfigError, match="not a readable image"):
        load_image(tmp_path / "notes.png")
    good = tmp_path / "good.png"
    Image.new("RGB", (64, 64), (1, 2, 3)).save(good)
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:60])  # header intact, data truncated
    with pytest.raises(ConfigError, match="could not be read|not a readable image"):
        load_image(tmp_path / "cut.png")


@pytest.mark.parametrize("mode", ["I;16", "F", "I"])
def test_unsupported_modes_are_refused(tmp_path: Path, mode: str) -> None:
    img = Image.new(mode, (4, 4))
    file = tmp_path / "deep.tiff"
    img.save(file)
    with pytest.raises(ConfigError, match=f"mode '{mode}'.*not supported.*8-bit"):
        load_image(file)


def test_anyres_is_named_as_unsupported() -> None:
    with pytest.raises(ConfigError, match=r"'anyres'.*not supported"):
        ImageConfig(16, aspect="anyres")
    with pytest.raises(ConfigError, match="'stretch' is unknown"):
        ImageConfig(16, aspect="stretch")
