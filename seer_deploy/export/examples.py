"""What the export traces with: example inputs for each denoising graph (torch.export follows them, so every dynamic
width differs from the others) and the fixed sizes of the cache tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from seer_deploy.contracts.graphs import (
    ATTENTION_MASK,
    CANDIDATES,
    INPUT_IDS,
    KV,
    PROMPT_KV,
    PROMPT_WIDTH,
    RUN_IDS,
    SAMPLE_UNIFORM,
    SCORE_RULE,
    SCORE_TEMPERATURE,
    TEMPERATURE,
    WINDOW_IDS,
    WINDOW_START,
    WITH_STATS,
    Size,
)
from seer_deploy.models.families.config import ModelConfig


def step_examples(cfg: ModelConfig, max_seq_len: int) -> dict[str, Tensor]:
    """Tracing examples for the step graphs' token and sampling inputs: batch 2, up to 8 positions, candidates of
    another width than the sequence and the window (so that tracing keeps them apart)."""
    S = min(8, max_seq_len)
    W = max(1, S // 2)
    C = max(1, S - 3)
    ids = torch.randint(0, cfg.vocab_size, (2, S), generator=torch.Generator().manual_seed(0))
    return {
        INPUT_IDS.name: ids,
        ATTENTION_MASK.name: torch.ones(2, S, dtype=torch.long),
        TEMPERATURE.name: torch.zeros(2),
        SAMPLE_UNIFORM.name: torch.ones(2, S),
        CANDIDATES.name: torch.arange(S - C, S).expand(2, C).contiguous(),
        WITH_STATS.name: torch.ones(2, dtype=torch.long),
        SCORE_RULE.name: torch.tensor([1, 2]),
        SCORE_TEMPERATURE.name: torch.ones(2),
        WINDOW_IDS.name: ids[:, S - W :],
        WINDOW_START.name: torch.tensor([S - W, 0]),
        KV.name: torch.zeros(cfg.n_layers, 2, 2, cfg.n_kv_heads, S, cfg.head_dim),
        PROMPT_WIDTH.name: torch.tensor([S - W, S - W]),
    }


def prompt_examples(cfg: ModelConfig, max_seq_len: int) -> dict[str, Tensor]:
    """Tracing examples for the prompt-cache graph: batch 2, 8 positions of which 5 cached and 3 run, 2 candidates
    (every width distinct, so that tracing keeps them apart)."""
    S = min(8, max_seq_len)
    cached = max(1, S - 3)
    run = S - cached
    ids = torch.randint(0, cfg.vocab_size, (2, run), generator=torch.Generator().manual_seed(0))
    return {
        RUN_IDS.name: ids,
        ATTENTION_MASK.name: torch.ones(2, S, dtype=torch.long),
        PROMPT_KV.name: torch.zeros(cfg.n_layers, 2, 2, cfg.n_kv_heads, cached, cfg.head_dim),
        SAMPLE_UNIFORM.name: torch.ones(2, run),
        CANDIDATES.name: torch.arange(1, run).expand(2, run - 1).contiguous(),
        SCORE_RULE.name: torch.tensor([2, 1]),
        SCORE_TEMPERATURE.name: torch.ones(2),
        PROMPT_WIDTH.name: torch.tensor([cached + 1, cached + 1]),
    }


def cache_sizes(cfg: ModelConfig) -> dict[Size, int]:
    """The Size dims of the cache graphs' kv tensor, for this model."""
    return {Size.LAYERS: cfg.n_layers, Size.KV_HEADS: cfg.n_kv_heads, Size.HEAD_DIM: cfg.head_dim}
