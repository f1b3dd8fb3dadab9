"""M-RoPE positions (Qwen2-VL's, which Dimple's language model uses): [3, B, S] (temporal, height, width).

A text token's three positions are equal and one past the previous token's largest; a picture's image tokens sit at
(start + frame, start + row, start + column) of its merged-token grid, and the text after it resumes at the
picture's largest position + 1, as Qwen2-VL's `get_rope_index` does. Without pictures this is the 1-D position
cumsum(mask) - 1 in all three rows.

Everything comes from the ids: image ids (>= id_base) point at rows of the batch's image table, and `picture_layout`
says, per table row, where that token sits inside its picture and how far the positions advance after it. So the
positions of any regrouped, padded or cut row (Seer's truncation, the hybrid batcher) follow from its ids alone, in
torch (models.networks.image_prompts) and on the host for the exported graphs (contracts.graph_calls) alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seer_deploy.models.pictures.qwen_layout import Grid

LAYOUT_COLUMNS = 4  # frame, row, column inside the picture; the advance after the token


def picture_layout(grids: Sequence[Grid], merge_size: int) -> np.ndarray:
    """int64 [image tokens, 4] for pictures in table order: each token's (frame, row, column) in its merged-token
    grid and the advance after it: 0, but the picture's last token advances by max(frames, rows, columns)."""
    parts = [np.zeros((0, LAYOUT_COLUMNS), dtype=np.int64)]
    for t, h, w in grids:
        rows, cols = h // merge_size, w // merge_size
        frame, row, col = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        part = np.stack([frame.ravel(), row.ravel(), col.ravel(), np.zeros(frame.size, dtype=np.int64)], axis=1)
        part[-1, 3] = max(t, rows, cols)
        parts.append(part.astype(np.int64))
    return np.concatenate(parts)


def _advances(input_ids: np.ndarray, attention_mask: np.ndarray | None, id_base: int, layout: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ids, mask, whether each column is an image token, and each column's layout row [B, S, 4]."""
    ids = np.asarray(input_ids, dtype=np.int64)
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
    table = np.asarray(layout, dtype=np.int64).reshape(-1, LAYOUT_COLUMNS)
    if table.shape[0] == 0:
        table = np.zeros((1, LAYOUT_COLUMNS), dtype=np.int64)
    return ids, mask, ids >= id_base, table[np.clip(ids - id_base, 0, table.shape[0] - 1)]


def text_position_shift(input_ids: np.ndarray, attention_mask: np.ndarray | None, id_base: int,
                        layout: np.ndarray) -> np.ndarray:
    """int64 [B]: how far each row's M-RoPE position of a text token after all its pictures runs ahead of the 1-D
    position cumsum(mask) - 1 (negative when a picture has more tokens than its largest side): the sum over its real
    image tokens of their advance minus one. The cached graphs take it (contracts.graphs.POSITION_SHIFT), since
    the columns they run are such text."""
    _, mask, is_image, rows = _advances(input_ids, attention_mask, id_base, layout)
    real_image = is_image & (mask != 0)
    return np.ascontiguousarray(np.where(real_image, rows[..., 3] - 1, 0).sum(axis=1), dtype=np.int64)


def mrope_positions(input_ids: np.ndarray, attention_mask: np.ndarray | None, id_base: int,
                    layout: np.ndarray) -> np.ndarray:
    """int64 [3, B, S]. input_ids [B, S] (image ids >= id_base index `layout`'s rows); attention_mask [B, S], 0 for
    padding (which advances nothing and gets the position of the next real token); layout from `picture_layout`."""
    _, mask, is_image, rows = _advances(input_ids, attention_mask, id_base, layout)
    advance = np.where(is_image, rows[..., 3], 1) * (mask != 0)
    start = np.cumsum(advance, axis=1) - advance
    offset = np.where(is_image[..., None], rows[..., :3], 0)
    return np.ascontiguousarray((start[..., None] + offset).transpose(2, 0, 1), dtype=np.int64)
