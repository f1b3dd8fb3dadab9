"""The mask predictor: bidirectional attention, left-padding invariance and in-forward MLP statistics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config, tiny_model

from seer_deploy.core.errors import CheckpointError
from seer_deploy.core.sparsity import STAT_NAMES, StatsSpec


def test_attention_is_bidirectional() -> None:
    model = tiny_model()
    ids = torch.randint(0, 19, (1, 10))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 19
    # A change at the last position moves the logits of the first: no causal mask.
    assert not torch.allclose(model(ids).logits[0, 0], model(changed).logits[0, 0])


def test_left_padded_row_equals_solo_run() -> None:
    model = tiny_model()
    short = torch.randint(0, 19, (1, 6))
    long = torch.randint(0, 19, (1, 9))
    batch = torch.cat([torch.cat([torch.full((1, 3), 11), short], dim=1), long])
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    padded = model(batch, mask).logits
    torch.testing.assert_close(padded[0, 3:], model(short).logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded[1], model(long).logits[0], rtol=1e-5, atol=1e-5)


def test_stats_match_a_manual_computation() -> None:
    model = tiny_model()
    ids = torch.randint(0, 19, (2, 8))
    spec = StatsSpec(layers=(1, 0), abs_threshold=0.1, rel_threshold=0.2)
    out = model(ids, stats=spec)
    assert out.stats is not None and out.stats.shape == (2, 2, len(STAT_NAMES), 8)
    # Recompute layer 1 by hand.
    x = model.embed(ids)
    from seer_deploy.models.networks.llada import rope_tables

    cos, sin = rope_tables(torch.arange(8).expand(2, 8), model.cfg.head_dim, model.cfg.rope_theta)
    x, _, _ = model.layers[0](x, cos, sin, None, None)
    block = model.layers[1]
    x = x + block.attn(block.attn_norm(x), cos, sin, None)[0]
    hin = block.mlp_norm(x)
    a = F.silu(block.mlp.gate(hin))
    h = a * block.mlp.up(hin)
    expected = torch.stack(
        [
            (h.abs() < 0.1).float().mean(-1),
            (a.abs() < 0.1).float().mean(-1),
            (h.abs() < 0.2 * h.abs().amax(-1, keepdim=True)).float().mean(-1),
            h.abs().mean(-1),
        ],
        dim=1,
    )
    torch.testing.assert_close(out.stats[:, 0], expected)  # spec order: layer 1 first
    assert torch.equal(out.logits, model(ids).logits)  # statistics do not change the prediction


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"n_heads": 0}, "'n_heads' is 0"),
        ({"n_heads": 3}, "'n_heads' is 3; it must be a divisor of the width 32"),
        ({"n_layers": 10**9}, "'n_layers' is 1000000000; it must be an integer from 1 to 1024"),
        ({"mask_id": 19}, "'mask_id' is 19; it must be a token id from 0 to 18"),
        ({"rms_eps": float("nan")}, "'rms_eps' is nan"),
        ({"tie_embeddings": 1}, "'tie_embeddings' is 1; it must be true or false"),
        ({"embedding_size": 4}, "'embedding_size' is 4; it must be at least the vocabulary size 19"),
    ],
)
def test_a_model_config_is_checked_however_it_is_built(overrides: dict[str, object], message: str) -> None:
    """Manifests build ModelConfig directly from JSON: the same checks as config.json, before any module exists."""
    with pytest.raises(CheckpointError, match=message):
        tiny_config(**overrides)
