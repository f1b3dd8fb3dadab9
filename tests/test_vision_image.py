"""Image files -> pixel tensors: conversion, padding, resizing, normalisation, and the errors for bad images."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.models.networks.vision import VisionConfig
from seer_deploy.models.pictures.image import ImageConfig, expand_to_square, load_image, preprocess


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


def _png_claiming(path: Path, width: int, height: int) -> Path:
    """A small valid PNG whose header is rewritten to claim width x height pixels (a decompression bomb)."""
    Image.new("1", (8, 8)).save(path)
    data = bytearray(path.read_bytes())
    data[16:24] = struct.pack(">II", width, height)  # IHDR's width and height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR's CRC over type + data
    path.write_bytes(bytes(data))
    return path


def test_decompression_bombs_are_refused_from_the_header(tmp_path: Path) -> None:
    bomb = _png_claiming(tmp_path / "bomb.png", 100_000, 100_000)
    assert bomb.stat().st_size < 1000
    with pytest.raises(ConfigError, match=r"bomb.png' is larger than the 67108864 pixels allowed \(Image size"):
        load_image(bomb)  # past twice Pillow's own limit: Pillow refuses at open
    big = _png_claiming(tmp_path / "big.png", 9000, 9000)
    with pytest.raises(ConfigError, match=r"big.png' is larger than the 67108864 pixels allowed \(9000 x 9000 pixels"):
        load_image(big)  # under Pillow's limits: ours, from the header, before decoding
    ok = _png_claiming(tmp_path / "ok.png", 8, 8)
    assert load_image(ok).size == (8, 8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"image_size": 0}, "image size 0 must be an integer"),
        ({"image_size": 16.5}, "image size 16.5 must be an integer"),
        ({"image_size": 10**6}, "from 1 to 8192"),
        ({"mean": (0.5, float("nan"), 0.5)}, "image_mean .* must be 3 finite numbers"),
        ({"std": (0.5, 0.0, 0.5)}, "image_std .* must be 3 finite numbers .* above 0"),
        ({"std": (0.5, 0.5)}, "image_std .* must be 3"),
    ],
)
def test_bad_image_configs_are_named(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"image_size": 16, **kwargs}
    with pytest.raises(CheckpointError, match=message):
        ImageConfig(**fields)  # type: ignore[arg-type]


SIGLIP = {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 2,
          "num_channels": 3, "image_size": 16, "patch_size": 4, "layer_norm_eps": 1e-6}


@pytest.mark.parametrize(
    "siglip, extra, message",
    [
        ({"num_attention_heads": 0}, {}, "'num_attention_heads' is 0; it must be an integer from 1"),
        ({"num_attention_heads": 5}, {}, "num_attention_heads 5 does not divide hidden_size 24"),
        ({"num_hidden_layers": 1e9}, {}, "'num_hidden_layers' is 1000000000.0"),
        ({"image_size": "16"}, {}, "'image_size' is '16'"),
        ({"num_channels": 4}, {}, "'num_channels' is 4; it must be an integer from 3 to 3"),
        ({"layer_norm_eps": float("nan")}, {}, "'layer_norm_eps' is nan"),
        ({"patch_size": 32}, {}, "patch_size 32 exceeds image_size 16"),
        ({}, {"image_token_index": 5}, "'image_token_index' is 5; .*negative"),
        ({}, {"projector_type": "mlp100000x_gelu"}, "mm_projector_type 'mlp100000x_gelu' is not supported"),
        ({}, {"projector_type": "mlp17x_gelu"}, "N up to 16"),
        ({}, {"select_layer": 2.5}, "'mm_vision_select_layer' is 2.5"),
        ({}, {"mm_hidden_size": 32}, "mm_hidden_size 32 differs"),
    ],
)
def test_bad_vision_configs_are_named(siglip: dict[str, object], extra: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"siglip": {**SIGLIP, **siglip}, "lm_hidden_size": 32, "mm_hidden_size": 24,
                                 "image": ImageConfig(16), **extra}
    with pytest.raises(CheckpointError, match=message):
        VisionConfig(**fields)  # type: ignore[arg-type]
    good = VisionConfig(siglip=SIGLIP, lm_hidden_size=32, mm_hidden_size=24, image=ImageConfig(16))
    assert good.tokens_per_image == 16
