"""Dimple's vision tower (Qwen2.5-VL's) and projector, in torch, against transformers' own
Qwen2_5_VisionTransformerPretrainedModel with the same random weights: windowed and full-attention blocks, pictures of
several sizes and aspect ratios, alone and several to a call. The host computes what the tower's Python loops do
(models.pictures.qwen_layout); its window order equals transformers' get_vision_window_index."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.vision_utils import get_vision_window_index

from seer_deploy.core.errors import CheckpointError
from seer_deploy.models.networks.qwen_vision import QwenTowerConfig, QwenVisionTower
from seer_deploy.models.pictures.qwen_layout import tower_inputs, window_order

# Four blocks, two of them full attention; windows of 112 px = 4 x 4 merged tokens, so the larger pictures below
# span several windows (and ragged ones at their edges).
TINY = {"depth": 4, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 24,
        "fullatt_block_indexes": [1, 3], "window_size": 112, "patch_size": 14, "spatial_merge_size": 2,
        "temporal_patch_size": 2}
# (1, rows, columns) in patches: square, tall, wide, one merged token, and three to a call.
CALLS = [[(1, 8, 8)], [(1, 20, 6)], [(1, 6, 26)], [(1, 2, 2)], [(1, 10, 4), (1, 16, 8), (1, 8, 10)]]
TOLERANCE = 1e-5  # max |diff| / max |value|: float32 rounding (measured: below 1e-6, printed by the test)


def reference_tower(seed: int = 0) -> Qwen2_5_VisionTransformerPretrainedModel:
    torch.manual_seed(seed)
    config = Qwen2_5_VLVisionConfig(**TINY)
    config._attn_implementation = "sdpa"
    model = Qwen2_5_VisionTransformerPretrainedModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from the init (norm weights of 1, biases of 0), so every tensor counts
            p.normal_(0.0, 0.2)
    return model


def ours(reference: torch.nn.Module, **changes: object) -> QwenVisionTower:
    tower = QwenVisionTower(QwenTowerConfig.from_dict({**TINY, **changes})).eval()
    tower.load_state_dict(reference.state_dict(), strict=True)  # transformers' names, every one
    return tower


def worst_diff(tower: QwenVisionTower, reference: torch.nn.Module, grids: list[tuple[int, int, int]]) -> float:
    rng = np.random.default_rng(sum(h * w for _, h, w in grids))
    patches = [rng.standard_normal((t * h * w, tower.cfg.patch_dim)).astype(np.float32) for t, h, w in grids]
    with torch.no_grad():
        want = reference(torch.from_numpy(np.concatenate(patches)), torch.tensor(grids)).pooler_output
        feed = tower_inputs(patches, grids, tower.cfg.geometry)
        got = tower(**{name: torch.from_numpy(value) for name, value in feed.items()})
    assert got.shape == want.shape
    return float((got - want).abs().max() / want.abs().max())


def test_the_tower_equals_transformers_qwen2_5_vl_on_pictures_of_every_shape() -> None:
    reference = reference_tower()
    tower = ours(reference)
    diffs = {str(grids): worst_diff(tower, reference, grids) for grids in CALLS}
    print("max |diff| / max |value| per call:", diffs)
    assert max(diffs.values()) < TOLERANCE, diffs


def test_the_comparison_fails_when_windows_or_order_are_wrong() -> None:
    """The check can fail: the same weights with every block attending to the whole picture, or with the merged
    tokens left in window order, differ from transformers on a picture that spans several windows."""
    reference = reference_tower()
    assert worst_diff(ours(reference, fullatt_block_indexes=[0, 1, 2, 3]), reference, [(1, 8, 16)]) > 100 * TOLERANCE
    tower = ours(reference)
    rng = np.random.default_rng(0)
    patches = [rng.standard_normal((8 * 16, tower.cfg.patch_dim)).astype(np.float32)]
    feed = tower_inputs(patches, [(1, 8, 16)], tower.cfg.geometry)
    feed["restore_order"] = np.arange(len(feed["restore_order"]))
    with torch.no_grad():
        got = tower(**{name: torch.from_numpy(value) for name, value in feed.items()})
        want = reference(torch.from_numpy(patches[0]), torch.tensor([(1, 8, 16)])).pooler_output
    assert float((got - want).abs().max()) > 1e-2


@pytest.mark.parametrize("grid", [(1, 8, 8), (1, 20, 6), (1, 6, 26), (1, 16, 16), (1, 2, 2)])
def test_window_order_is_transformers_window_index(grid: tuple[int, int, int]) -> None:
    tower_cfg = QwenTowerConfig.from_dict(TINY)
    order, window = window_order(grid, tower_cfg.geometry)
    index, bounds = get_vision_window_index(torch.tensor([grid]), 2, 112, 14)
    np.testing.assert_array_equal(order, index.numpy())
    sizes = np.diff(np.unique(bounds.numpy())) // 4  # merged tokens per (non-empty) window
    np.testing.assert_array_equal(np.bincount(window), sizes)


@pytest.mark.parametrize(("change", "named"), [
    ({"model_type": "qwen2_vl"}, "qwen2_vl"),
    ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu'"),
    ({"in_channels": 4}, "in_channels 4"),
    ({"fullatt_block_indexes": [1, 9]}, "fullatt_block_indexes"),
    ({"window_size": 100}, "window_size 100"),
    ({"num_heads": 16}, "num_heads 16"),  # a head size of 2: too small for the 2-D rotary embedding
])
def test_a_tower_config_that_is_not_implemented_is_named(change: dict[str, object], named: str) -> None:
    with pytest.raises(CheckpointError, match=named.replace("(", r"\(")):
        QwenTowerConfig.from_dict({**TINY, **change})
