"""What a Qwen2.5-VL vision tower computes from its pictures' grids with Python loops, computed here on the host.

The tower (Dimple's, Qwen2.5-VL-7B's `visual.*`) reorders each picture's merged tokens window by window (windows of
`window_size` pixels), attends inside windows in most blocks and inside pictures in the others, and rotates queries
and keys by each patch's (row, column). transformers builds all of that from `grid_thw` with `.tolist()` and loops,
so a traced graph would bake one picture size in; as optimum-intel's exports of this tower do, the host computes the
window order, the boundaries (as segment ids, which the graph turns into attention masks) and the rotary tables per
call and feeds them, and one graph serves every picture size (models.networks.qwen_vision, the vision graph).

A merged token is `merge_size**2` patches (2 x 2) that stay together through the reordering, so every per-patch
input is shaped [image_tokens, merge_size**2, ...] and the call has one dynamic axis, its image tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seer_deploy.core.errors import ConfigError

ROTARY_THETA = 10000.0  # the base of Qwen2.5-VL's vision rotary embedding
Grid = tuple[int, int, int]  # (frames, patch rows, patch columns): a picture's grid_thw


@dataclass(frozen=True)
class TowerGeometry:
    """The numbers of a tower config the host needs (models.networks.qwen_vision.QwenTowerConfig.geometry)."""

    patch_size: int
    merge_size: int
    window_size: int  # pixels
    head_dim: int

    @property
    def merge_unit(self) -> int:
        return self.merge_size**2

    @property
    def window_side(self) -> int:
        """A window's side in merged tokens (112 px / 14 px / 2 = 4)."""
        return self.window_size // self.merge_size // self.patch_size


def tokens_of(grid: Grid, merge_size: int) -> int:
    """The merged tokens (= image tokens in the prompt) of a picture: t * h * w / merge_size**2."""
    t, h, w = grid
    return t * (h // merge_size) * (w // merge_size)


def window_order(grid: Grid, geometry: TowerGeometry) -> tuple[np.ndarray, np.ndarray]:
    """A picture's merged tokens in window order (indices into its row-major token grid) and each one's window:
    windows frame by frame, row by row, tokens row-major inside a window; empty windows do not exist."""
    t, h, w = grid
    rows, cols = h // geometry.merge_size, w // geometry.merge_size
    side = geometry.window_side
    frame, row, col = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
    window = ((frame * -(-rows // side) + row // side) * -(-cols // side) + col // side).ravel()
    token = np.arange(t * rows * cols)
    order = np.lexsort((token, window))
    return token[order], window[order]


def rotary_angles(grid: Grid, geometry: TowerGeometry) -> np.ndarray:
    """float32 [patches, head_dim / 2]: each patch's row angles then column angles, patches in the tower's order
    (each 2 x 2 merge block contiguous), repeated per frame."""
    t, h, w = grid
    m = geometry.merge_size
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    blocks = (h // m, m, w // m, m)
    hpos = rows.reshape(blocks).transpose(0, 2, 1, 3).ravel()
    wpos = cols.reshape(blocks).transpose(0, 2, 1, 3).ravel()
    half = geometry.head_dim // 2
    inv_freq = (1.0 / ROTARY_THETA ** (np.arange(0, half, 2, dtype=np.float32) / half)).astype(np.float32)
    angles = np.concatenate([hpos[:, None] * inv_freq, wpos[:, None] * inv_freq], axis=1).astype(np.float32)
    return np.tile(angles, (t, 1))


def tower_inputs(patches: Sequence[np.ndarray], grids: Sequence[Grid], geometry: TowerGeometry
                 ) -> dict[str, np.ndarray]:
    """The vision graph's inputs (contracts.graphs.QWEN_VISION) for pictures given as the processor gives them
    (patches [t*h*w, patch_dim] each, in its order), all of them in one call. Output row j of the graph is image
    token j: picture by picture, row-major inside each."""
    unit = geometry.merge_unit
    order_parts, window_parts, picture_parts, angle_parts = [], [], [], []
    tokens = windows = 0
    for index, grid in enumerate(grids):
        order, window = window_order(grid, geometry)
        order_parts.append(order + tokens)
        window_parts.append(window + windows)
        picture_parts.append(np.full(len(order), index, dtype=np.int64))
        angle_parts.append(rotary_angles(grid, geometry))
        tokens += len(order)
        windows += int(window.max(initial=-1)) + 1
    if len(patches) != len(grids) or sum(len(p) for p in patches) != tokens * unit:
        raise ConfigError(f"{sum(len(p) for p in patches)} patches in {len(patches)} pictures do not fill grids "
                         f"{list(grids)}")
    order = np.concatenate(order_parts)
    pixels = np.concatenate(patches).reshape(tokens, unit, -1)[order]
    angles = np.concatenate(angle_parts).reshape(tokens, unit, -1)[order]
    emb = np.concatenate([angles, angles], axis=-1)
    return {
        "pixel_patches": np.ascontiguousarray(pixels, dtype=np.float32),
        "rotary_cos": np.cos(emb).astype(np.float32),
        "rotary_sin": np.sin(emb).astype(np.float32),
        "window_segments": np.concatenate(window_parts).astype(np.int64),
        "picture_segments": np.concatenate(picture_parts).astype(np.int64),
        "restore_order": np.argsort(order, kind="stable").astype(np.int64),
    }
