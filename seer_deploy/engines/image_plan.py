"""How large a multimodal engine's image axes must be: image-table rows and pictures per vision call.

A batch's image table holds every image token of its prompts (image_prompts.expand_placeholders numbers them), so its
rows are at most the batch's pictures times the most tokens one picture becomes: `tokens_per_image` for one view per
picture, or with LaViDa's anyres the base view plus the largest pinpoint's full grid of crops, each grid row closed by
image_newline (models.pictures.anyres; the cut padding only lowers it). Image tokens sit in the prompts, so the rows never pass
max_batch x max_prompt either. The vision graph takes every picture of a batch in one call (one view each), or with
anyres one picture's views per call (its base view and crops).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from seer_deploy.core.errors import ArtifactError, CheckpointError, ConfigError
from seer_deploy.engines.profiles import ImageAxes
from seer_deploy.models.pictures.anyres import AnyresConfig


@dataclass(frozen=True)
class PictureTokens:
    """What one picture of an export becomes: its fewest and most image tokens, and its most views."""

    fewest: int
    most: int
    views: int


def picture_tokens(vision_config: Mapping[str, Any]) -> PictureTokens:
    """From a multimodal export's manifest (extra.multimodal.vision_config)."""
    per_view = int(vision_config["tokens_per_image"])
    try:
        anyres = AnyresConfig.from_dict(vision_config.get("anyres"))
    except CheckpointError as exc:
        raise ArtifactError(f"the export's anyres record is malformed ({exc}); re-export the model") from exc
    if anyres is None:
        return PictureTokens(per_view, per_view, 1)
    side = math.isqrt(per_view - 1)  # the pooled patch grid of one view (per_view = side * side + image_newline)
    grids = [(h // anyres.crop, w // anyres.crop) for w, h in anyres.pinpoints]
    most = max(side * side + rows * side * (cols * side + 1) for rows, cols in grids)
    return PictureTokens(per_view, most, 1 + max(rows * cols for rows, cols in grids))


def plan_image_axes(vision_config: Mapping[str, Any], max_batch: int, max_prompt: int,
                    max_pictures: int | None = None) -> ImageAxes:
    """The image axes of an engine whose batches hold at most `max_pictures` pictures (None: as many as the widest
    prompts of the largest batch can hold); ConfigError for a count the prompts cannot hold."""
    picture = picture_tokens(vision_config)
    fits = max_batch * (max_prompt // picture.fewest)
    if fits == 0:
        raise ConfigError(f"--max-prompt {max_prompt} holds no picture of {picture.fewest} image tokens; raise "
                          f"--max-prompt to at least {picture.fewest + 1}")
    if max_pictures is not None and not 1 <= max_pictures <= fits:
        raise ConfigError(f"--max-pictures {max_pictures}: a batch of {max_batch} prompts of at most {max_prompt} "
                          f"tokens holds 1..{fits} pictures of {picture.fewest}+ image tokens; use a value in that "
                          "range or raise --max-batch/--max-prompt")
    pictures = max_pictures or fits
    rows = min(pictures * picture.most, max_batch * max_prompt)
    return ImageAxes(image_tokens=rows, images=picture.views if picture.views > 1 else pictures)
