"""The Dream family's published decoding loops, transcribed for the tests from their public descriptions (batch 1, no
padding, the whole response as masks); every other loop is compared with these.

Sources (read, not copied):
- Dream: `generation_utils.py` shipped with Dream-v0-Instruct-7B (public copy: github.com/Higashi-Masafumi/
  llm-error-injection, dream/generation_utils.py, commit 112c469), `DreamGenerationMixin._sample` and
  `sample_tokens`.
- Dimple: github.com/yu-rp/Dimple, training-code/models/generation_utils.py, `_sample` with
  decoding_pipeline="dim" (use_original_confidence on, its default) and `sample_tokens`.

Where the authors draw random numbers (origin's per-mask coin, Dimple's random fallback positions, alg_temp's
torch.multinomial) the transcription draws them from a numpy generator in the order the runtime loop does: one
float32 uniform per mask, columns in order. torch.multinomial without replacement takes the top k of p / q with q
exponential draws; q = -log(u) here.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from seer_deploy.models.networks.llada import MaskPredictor


def shifted_logits(model: MaskPredictor, x: Tensor) -> Tensor:
    """The network's logits [S, V] for a 1-D sequence, then Dream's shift: cat(logits[:1], logits[:-1])."""
    logits = model.logits_of(model.hidden_states(x[None]).hidden)[0].float()
    return torch.cat([logits[:1], logits[:-1]], dim=0)


def sample_tokens(logits: Tensor, alg: str) -> tuple[Tensor, Tensor]:
    """Temperature 0, no top-p / top-k: (confidence, x0) per masked position."""
    probs = torch.softmax(logits, dim=-1)
    confidence, x0 = probs.max(dim=-1)
    if alg == "topk_margin":
        top = torch.sort(probs, dim=-1, descending=True).values
        confidence = top[:, 0] - top[:, 1]
    if alg == "entropy":
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


def draws(rng: np.random.Generator, n: int) -> Tensor:
    return torch.from_numpy(rng.random(n, dtype=np.float32))


def pick(confidence: Tensor, k: int, alg_temp: float, rng: np.random.Generator) -> Tensor:
    """topk(confidence, k), or k positions drawn from softmax(confidence / alg_temp) without replacement."""
    if alg_temp == 0:
        return torch.topk(confidence, k).indices
    p = torch.softmax(confidence / alg_temp, dim=-1)
    return torch.topk(p / -torch.log(draws(rng, confidence.shape[0])), k).indices


@torch.no_grad()
def dream(model: MaskPredictor, prompt: list[int], gen_length: int, steps: int, alg: str, *, eps: float = 1e-3,
          alg_temp: float = 0.0, seed: int = 0) -> tuple[list[int], list[int]]:
    """Dream's `_sample`: (response, tokens committed at each of the `steps` passes)."""
    mask_id, rng = model.cfg.mask_id, np.random.default_rng(seed)
    x = torch.tensor(prompt + [mask_id] * gen_length)
    timesteps = torch.linspace(1, eps, steps + 1)
    committed = []
    for i in range(steps):
        mask_index = x == mask_id
        mask_logits = shifted_logits(model, x)[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        before = int(mask_index.sum())
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            x0 = torch.zeros_like(x[mask_index]) + mask_id
            transfer = draws(rng, x0.shape[0]) < p_transfer
            x0[transfer] = sample_tokens(mask_logits[transfer], alg)[1]
            x[mask_index] = x0.clone()
        else:
            confidence, x0 = sample_tokens(mask_logits, alg)
            num_mask_token = mask_index.sum() / 1  # the batch mean at batch 1
            number = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
            # Dream ranks full_confidence, -inf off the masks (never taken, and probability 0 under alg_temp):
            # the same choice among the masks alone.
            if number > 0:
                index = pick(confidence, number, alg_temp, rng)
                x0_ = torch.full_like(x0, mask_id)
                x0_[index] = x0[index]
                x[mask_index] = x0_
        committed.append(before - int((x == mask_id).sum()))
    return x[len(prompt):].tolist(), committed


@torch.no_grad()
def dimple(model: MaskPredictor, prompt: list[int], gen_length: int, steps: int, alg: str, threshold: float, *,
           eps: float = 1e-3, alg_temp: float = 0.0, seed: int = 0) -> tuple[list[int], int]:
    """Dimple's `_sample` with decoding_pipeline="dim": (response, passes made)."""
    mask_id, rng = model.cfg.mask_id, np.random.default_rng(seed)
    x = torch.tensor(prompt + [mask_id] * gen_length)
    timesteps = torch.linspace(1, eps, steps + 1)
    num_total_mask = (x == mask_id).sum()
    passes = 0
    for i in range(steps):
        mask_index = x == mask_id
        confidence, x0 = sample_tokens(shifted_logits(model, x)[mask_index], alg)
        passes += 1
        transfer = torch.ones_like(confidence, dtype=torch.bool) if i == steps - 1 else confidence > threshold
        if transfer.sum() > 0:
            x[mask_index] = torch.where(transfer, x0, torch.full_like(x0, mask_id))
        else:
            num_cur_mask = mask_index.sum()
            ratio = num_cur_mask / num_total_mask
            valid = (timesteps < ratio).nonzero(as_tuple=True)[0]
            t, number = ratio, int(num_cur_mask)
            for s_idx in range(max(int(valid.min()), i + 1), steps + 1):
                s = timesteps[s_idx]
                number = int(num_cur_mask * (1 - s / t)) if s > timesteps[-1] else int(num_cur_mask)
                if number >= 1:
                    break
            if alg == "origin":  # randperm(n)[:number]: here the top `number` of uniform draws
                index = torch.topk(draws(rng, x0.shape[0]), number).indices
            else:
                index = pick(confidence, number, alg_temp, rng)
            x0_ = torch.full_like(x0, mask_id)
            x0_[index] = x0[index]
            x[mask_index] = x0_
        if bool((x != mask_id).all()):
            break
    return x[len(prompt):].tolist(), passes


@torch.no_grad()
def lavida_dream(model: MaskPredictor, prompt: list[int], gen_length: int, steps: int, alg: str, *,
                 eps: float = 1e-3) -> list[int]:
    """LaViDa's Dream `_sample` with prefix_lm (jacklishufan/LaViDa, llava/model/language_model/dream/
    generation_utils.py, commit 284ef5c): the prompt pass's last logits give the first answer token greedily; then
    min(steps, max_new_tokens) passes over the response against the prompt (prefix-DLM: the prompt's keys are those
    of the prompt alone, so the full sequence's response columns give the cached pass's logits), the shift inside
    the response. Temperature 0, deterministic rules."""
    mask_id, P = model.cfg.mask_id, len(prompt)
    width = torch.tensor([P])
    prefill = model.logits_of(model.hidden_states(torch.tensor(prompt)[None], prompt_width=width).hidden)[0]
    x = torch.tensor([int(prefill[-1].argmax())] + [mask_id] * (gen_length - 1))
    steps = min(steps, gen_length)
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        full = torch.cat([torch.tensor(prompt), x])[None]
        logits = model.logits_of(model.hidden_states(full, prompt_width=width).hidden)[0, P:].float()
        logits = torch.cat([logits[:1], logits[:-1]], dim=0)
        confidence, x0 = sample_tokens(logits[mask_index], alg)
        t, s = timesteps[i], timesteps[i + 1]
        number = int(mask_index.sum() * (1 - s / t)) if i < steps - 1 else int(mask_index.sum())
        if number > 0:
            index = torch.topk(confidence, number).indices
            x0_ = torch.full_like(x0, mask_id)
            x0_[index] = x0[index]
            x[mask_index] = x0_
    return x.tolist()
