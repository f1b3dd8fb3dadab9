"""Gather what calibration and studies need from a prompt set: step-zero profiles and full-length answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from seer_deploy.core.generation import GenerationConfig, left_pad
from seer_deploy.core.sparsity import SparsityRow, StatsSpec, layer_major_rows
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.response_profile import ResponseProfile

Thresholds = tuple[float, float]  # (abs_threshold, rel_threshold)


def stop_ids(cfg: ModelConfig) -> set[int]:
    """The ids that end an answer: EOS, and the end-of-turn id where the checkpoint has one."""
    return {cfg.eos_id} | ({cfg.eot_id} if cfg.eot_id is not None else set())


@dataclass(frozen=True)
class StepZeroSet:
    """Step zero over N prompts at one gen_length, with the MLP statistics of every layer at several thresholds."""

    gen_length: int
    token_ids: np.ndarray  # int64 [N, G]
    eos_prob: np.ndarray  # float32 [N, G]
    sparsity_rows: tuple[SparsityRow, ...]  # every (layer, statistic), layer-major
    sparsity: dict[Thresholds, np.ndarray]  # thresholds -> float32 [N, len(sparsity_rows), G]

    @property
    def n(self) -> int:
        return int(self.token_ids.shape[0])

    def profile(self, i: int, thresholds: Thresholds) -> ResponseProfile:
        return ResponseProfile(self.token_ids[i], self.eos_prob[i], self.sparsity[thresholds][i], self.sparsity_rows)

    def subset(self, index: np.ndarray) -> StepZeroSet:
        return StepZeroSet(
            self.gen_length,
            self.token_ids[index],
            self.eos_prob[index],
            self.sparsity_rows,
            {k: v[index] for k, v in self.sparsity.items()},
        )


@torch.no_grad()
def step_zero_set(
    model: MaskPredictor,
    prompts: Sequence[list[int]],
    gen_length: int,
    thresholds: Sequence[Thresholds] = ((0.05, 0.05),),
    batch_size: int = 64,
) -> StepZeroSet:
    """Run step zero (prompt + gen_length masks, nothing committed yet) on every prompt, batched and left-padded."""
    cfg = model.cfg
    layers = tuple(range(cfg.n_layers))
    sparsity_rows = tuple(layer_major_rows(layers))
    pad_id = cfg.pad_id if cfg.pad_id is not None else cfg.eos_id
    ids_out, eos_out = [], []
    stats_out: dict[Thresholds, list[np.ndarray]] = {t: [] for t in thresholds}
    for lo in range(0, len(prompts), batch_size):
        chunk = list(prompts[lo : lo + batch_size])
        ids, mask = (torch.from_numpy(a) for a in left_pad(chunk, pad_id))
        B, P = ids.shape
        x = torch.cat([ids, torch.full((B, gen_length), cfg.mask_id, dtype=torch.long)], dim=1)
        attn = torch.cat([mask, torch.ones(B, gen_length, dtype=torch.long)], dim=1)
        attention_mask = None if bool(attn.all()) else attn
        for n, t in enumerate(thresholds):
            out = model(x, attention_mask, stats=StatsSpec(layers, t[0], t[1]))
            assert out.stats is not None
            stats_out[t].append(out.stats[:, :, :, P:].reshape(B, len(sparsity_rows), gen_length).float().numpy())
            if n == 0:
                probs = F.softmax(out.logits[:, P:].float(), dim=-1)
                ids_out.append(out.logits[:, P:].argmax(-1).numpy())
                eos_out.append(probs[..., cfg.eos_id].numpy())
    return StepZeroSet(
        gen_length=gen_length,
        token_ids=np.concatenate(ids_out).astype(np.int64),
        eos_prob=np.concatenate(eos_out).astype(np.float32),
        sparsity_rows=sparsity_rows,
        sparsity={t: np.concatenate(v).astype(np.float32) for t, v in stats_out.items()},
    )


def full_generation(
    model: MaskPredictor,
    prompts: Sequence[list[int]],
    config: GenerationConfig,
    batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Full-length answers [N, gen_length] from the reference loop, in batches of similar prompt length."""
    return batched_generation(model, prompts, config, batch_size=batch_size, progress=progress)[0]


def batched_generation(
    model: MaskPredictor,
    prompts: Sequence[list[int]],
    config: GenerationConfig,
    seer: SeerConfig | None = None,
    batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Answers [N, gen_length] and kept lengths [N] (gen_length without Seer) from the reference loop, in batches
    of similar prompt length, in prompt order."""

    def run(batch: list[list[int]]) -> tuple[np.ndarray, list[int] | None]:
        out = generate(model, batch, config, seer=seer)
        return out.tokens.numpy(), None if out.seer is None else [r.kept for r in out.seer]

    return in_length_order(prompts, config.gen_length, batch_size, run, progress)


def in_length_order(
    prompts: Sequence[list[int]],
    gen_length: int,
    batch_size: int,
    run: Callable[[list[list[int]]], tuple[np.ndarray, list[int] | None]],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`run` (a batch -> its answers and kept lengths, None at full length) over batches of similar prompt length,
    so little padding runs; answers [N, gen_length] and kept lengths [N] come back in prompt order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    tokens = np.zeros((len(prompts), gen_length), dtype=np.int64)
    kept = np.full(len(prompts), gen_length, dtype=np.int64)
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        answers, batch_kept = run([prompts[i] for i in idx])
        tokens[idx] = answers
        if batch_kept is not None:
            kept[idx] = batch_kept
        if progress is not None:
            progress(min(lo + batch_size, len(order)), len(order))
    return tokens, kept
