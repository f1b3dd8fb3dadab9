"""The reference loop's forward pass: the logits of a sequence, with classifier-free guidance and a prefix-DLM
model's prompt width (runtime.reference and the torch backend both run it)."""

from __future__ import annotations

import torch
from torch import Tensor

from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.networks.llada import MaskPredictor


def prefix_width(model: MaskPredictor, batch: int, prompt_width: int | None, device: torch.device
                 ) -> dict[str, Tensor]:
    """The `prompt_width` keyword a prefix-DLM model's forward takes (none for other models)."""
    if not model.cfg.prefix_dlm:
        return {}
    if prompt_width is None:
        raise ValueError("a prefix-DLM model's pass needs the prompt width")
    return {"prompt_width": torch.full((batch,), prompt_width, dtype=torch.long, device=device)}


def guided_logits(
    model: MaskPredictor,
    x: Tensor,
    attention_mask: Tensor | None,
    is_prompt: Tensor,
    cfg_scale: float,
    mask_id: int,
    spec: StatsSpec | None = None,
    prompt_width: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Logits (with classifier-free guidance when cfg_scale > 0: a second copy with the prompt masked gives the
    unconditional logits) and, with `spec`, the conditional pass's stats. A prefix-DLM model (LaViDa) also gets
    `prompt_width`, the columns holding the (left-padded) prompts, which do not attend to the response."""
    if cfg_scale == 0:
        out = model(x, attention_mask, stats=spec, **prefix_width(model, x.shape[0], prompt_width, x.device))
        return out.logits, out.stats
    # Classifier-free guidance: a second copy with the prompt masked gives the unconditional logits.
    uncond = torch.where(is_prompt, torch.full_like(x, mask_id), x)
    mask2 = None if attention_mask is None else torch.cat([attention_mask, attention_mask])
    out = model(torch.cat([x, uncond]), mask2, stats=spec,
                **prefix_width(model, 2 * x.shape[0], prompt_width, x.device))
    cond_logits, uncond_logits = out.logits.chunk(2)
    stats = None if out.stats is None else out.stats.chunk(2)[0]
    return uncond_logits + (cfg_scale + 1) * (cond_logits - uncond_logits), stats
