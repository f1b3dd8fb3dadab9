"""Dimple's pictures before the tower and its prompt positions: the patches equal transformers' Qwen2.5-VL image
processor's (Qwen2VLImageProcessorPil, settings from a preprocessor_config.json), pictures it cannot place are refused
in one line, and the M-RoPE positions of a prompt with text, picture, text, picture equal Qwen2-VL's get_rope_index."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dimple_checkpoint import qwen_rope_index
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from seer_deploy.core.errors import ConfigError
from seer_deploy.models.pictures.mrope import mrope_positions, picture_layout
from seer_deploy.models.pictures.qwen_pictures import QwenPictureConfig

# A preprocessor_config.json as Qwen2.5-VL ships one, with a small max_pixels so that large pictures shrink.
PREPROCESSOR = {"min_pixels": 3136, "max_pixels": 28 * 28 * 64, "patch_size": 14, "temporal_patch_size": 2,
                "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711], "image_processor_type": "Qwen2VLImageProcessor"}
# (width, height): a multiple of 28, odd sizes, one under min_pixels (upscaled), ones over max_pixels (downscaled)
SIZES = [(56, 56), (100, 60), (31, 45), (640, 480), (90, 1000), (1200, 300)]
IMAGE_PAD, VISION_START, VISION_END = 151655, 151652, 151653  # Qwen2-VL's ids, as Dimple's config has them


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed + width * height)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("size", SIZES)
def test_patches_equal_transformers_qwen2_vl_image_processor(size: tuple[int, int]) -> None:
    cfg = QwenPictureConfig.from_dict(PREPROCESSOR)
    image = picture(*size)
    patches, grid = cfg.patches(image)
    want = Qwen2VLImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"})(
        images=[image], return_tensors="np")
    assert list(grid) == want["image_grid_thw"][0].tolist()
    np.testing.assert_allclose(patches, want["pixel_values"], atol=1e-6, rtol=0)
    assert cfg.tokens(*size) == grid[1] * grid[2] // 4
    _, h, w = grid
    assert PREPROCESSOR["min_pixels"] <= h * w * 14 * 14 <= PREPROCESSOR["max_pixels"]


@pytest.mark.parametrize(("size", "named"), [
    ((20, 100), "at least 28 px a side"),
    ((28, 6000), "aspect ratio above 200"),
    ((28, 5000), "more than max_pixels"),  # the rules keep 28 px across, so the length cannot shrink enough
])
def test_a_picture_the_rules_cannot_place_is_refused_in_one_line(size: tuple[int, int], named: str) -> None:
    cfg = QwenPictureConfig.from_dict({**PREPROCESSOR, "max_pixels": 28 * 28 * 4})
    with pytest.raises(ConfigError, match=named) as refused:
        cfg.patches(picture(*size), "picture 'p.png'")
    assert "p.png" in str(refused.value) and "\n" not in str(refused.value)


def test_positions_equal_qwen2_vl_get_rope_index_for_text_picture_text_picture() -> None:
    """Two rows, left-padded: text, a 4 x 6-token picture, text, a 3 x 2-token picture, text; and text, one picture
    of 5 x 5, text. Our ids carry image ids (id_base + table row); Qwen's carry <|image_pad|>."""
    id_base = 160000
    grids = [(1, 8, 12), (1, 6, 4), (1, 10, 10)]
    counts = [t * h * w // 4 for t, h, w in grids]
    rows_of_pictures = [[0, 1], [2]]
    texts = [[[11, 12, 13, VISION_START], [VISION_END, 14, 15], [VISION_END, 16, 17, 18]],
             [[21, VISION_START], [VISION_END, 22, 23, 24, 25]]]
    ours, qwen, table_row = [], [], 0
    for pieces, pictures in zip(texts, rows_of_pictures, strict=True):
        mine, theirs = list(pieces[0]), list(pieces[0])
        for k, index in enumerate(pictures):
            mine += range(id_base + table_row, id_base + table_row + counts[index])
            theirs += [IMAGE_PAD] * counts[index]
            table_row += counts[index]
            mine += pieces[k + 1]
            theirs += pieces[k + 1]
        ours.append(mine)
        qwen.append(theirs)
    width = max(map(len, ours))
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in ours])
    ours_ids = np.array([[0] * (width - len(r)) + r for r in ours])
    qwen_ids = torch.tensor([[0] * (width - len(r)) + r for r in qwen])
    got = mrope_positions(ours_ids, mask, id_base, picture_layout(grids, 2))
    want = qwen_rope_index(qwen_ids, grids, torch.from_numpy(mask), IMAGE_PAD).numpy()
    real = mask.astype(bool)
    np.testing.assert_array_equal(got[:, real], want[:, real])
    assert got[:, 0, -1].tolist() != [len(ours[0]) - 1] * 3  # pictures moved the text positions (the test can fail)
    text_only = mrope_positions(ours_ids, mask, 10**9, picture_layout([], 2))  # no image ids: 1-D positions
    np.testing.assert_array_equal(text_only, np.broadcast_to(np.clip(mask.cumsum(1) - 1, 0, None), (3, *mask.shape)))


def test_the_language_models_m_rope_tables_equal_qwen2_5_vl_rotary_embedding() -> None:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    from seer_deploy.models.networks.llada import rope_tables

    section = (2, 3, 3)  # a head of 16 dims: 8 frequencies
    config = Qwen2_5_VLTextConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": list(section)})
    rng = np.random.default_rng(0)
    positions = torch.from_numpy(rng.integers(0, 500, (3, 2, 9)))
    want_cos, want_sin = Qwen2_5_VLRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions)
    cos, sin = rope_tables(positions, 16, 1e6, section)
    torch.testing.assert_close(cos[:, 0], want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[:, 0], want_sin, rtol=0, atol=1e-6)
    flat_cos, _ = rope_tables(positions[1], 16, 1e6)  # the 1-D table differs unless the three rows agree
    assert float((flat_cos[:, 0] - want_cos).abs().max()) > 1e-2
