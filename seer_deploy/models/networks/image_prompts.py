"""Prompts with pictures, torch side: image ids embed to their image-table row, every other id to its token
embedding; `ImageConditionedModel` is a MaskPredictor that does that lookup.

Because the image ids travel inside the ids (`models.prompts.image_placeholders`), any loop that regroups, pads or truncates
rows (Seer's hybrid batching) keeps each row pointing at its own images; and the exported graphs do the same lookup
in-graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

import numpy as np
import torch
from torch import Tensor, nn

from seer_deploy.core.errors import ConfigError
from seer_deploy.models.networks.llada import HiddenOutput, MaskPredictor, PassOptions
from seer_deploy.models.pictures.mrope import mrope_positions, picture_layout


def image_table(embeds: Sequence[Tensor], width: int) -> Tensor:
    """[max(1, n_tokens), width]: every image's embeddings in batch order (a zero row when there are none)."""
    rows = [e.reshape(-1, width) for e in embeds if e.numel()]
    if not rows:
        return torch.zeros(1, width)
    return torch.cat(rows)


def embed_with_images(embed: nn.Embedding, ids: Tensor, table: Tensor) -> Tensor:
    """Token embeddings, with ids >= embed.num_embeddings taken from the image table (row id - num_embeddings)."""
    n = embed.num_embeddings
    is_image = ids >= n
    text = embed(torch.where(is_image, torch.zeros_like(ids), ids))
    rows = table[(ids - n).clamp(min=0)]
    return torch.where(is_image[..., None], rows.to(text.dtype), text)


class ImageConditionedModel(MaskPredictor):
    """A MaskPredictor whose prompts may hold image ids: it shares the LM's modules and holds the image table.

    Every loop written for a MaskPredictor (the reference loop, Seer's truncated loop, a torch backend) runs on it
    unchanged, since image ids are plain ints in the prompt.
    """

    image_table: Tensor

    def __init__(self, lm: MaskPredictor, table: Tensor, layout: np.ndarray | None = None) -> None:
        """`layout`: with an M-RoPE language model (Dimple), the table rows' places in their pictures
        (models.pictures.mrope.picture_layout), from which every pass computes its positions."""
        nn.Module.__init__(self)  # share the LM's modules and settings rather than building new ones
        for name, value in vars(lm).items():
            if not name.startswith("_") and name != "training":
                setattr(self, name, value)  # cfg and whatever options a model family adds
        for name, child in lm.named_children():
            self.add_module(name, child)
        self.register_buffer("image_table", table.to(lm.embed.weight), persistent=False)
        self.image_layout = picture_layout([], 1) if layout is None else layout

    def hidden_states(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None, *,
                      stats_wanted: Tensor | None = None, **options: Unpack[PassOptions]) -> HiddenOutput:
        """MaskPredictor.hidden_states; an M-RoPE model's positions come from the ids (models.pictures.mrope)."""
        if options.get("position_ids") is None and self.cfg.mrope_section is not None and input_ids is not None:
            mask = None if attention_mask is None else attention_mask.cpu().numpy()
            positions = mrope_positions(input_ids.cpu().numpy(), mask, self.embed.num_embeddings, self.image_layout)
            options["position_ids"] = torch.from_numpy(positions).to(input_ids.device)
        return super().hidden_states(input_ids, attention_mask, stats_wanted=stats_wanted, **options)

    def embed_inputs(self, input_ids: Tensor | None) -> Tensor:
        if input_ids is None:
            raise ConfigError("give input_ids or inputs_embeds")
        return embed_with_images(self.embed, input_ids, self.image_table)
