"""scripts/train_demo.py's batch and loss: the parts of the demo's training recipe that plain code can check."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_demo.py"


@pytest.fixture(scope="module")
def train_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_demo", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_demo"] = module
    spec.loader.exec_module(module)
    return module


EOS = 11


def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # prompt (1 position), answer, EOS tail; the second row ends in padding outside the response
    ids = torch.tensor([[5, 1, 2, EOS, EOS, EOS, EOS], [5, 3, EOS, EOS, EOS, EOS, EOS]])
    resp = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    logits = torch.randn(2, 7, 19, generator=torch.Generator().manual_seed(0))
    return ids, resp, logits


def test_answer_weight_one_is_the_plain_masked_mean(train_demo: ModuleType) -> None:
    ids, resp, logits = _rows()
    masked = resp.clone()
    plain = F.cross_entropy(logits[masked], ids[masked])
    assert torch.allclose(train_demo.masked_loss(logits, ids, masked, resp, EOS, 1.0), plain)


def test_answer_weight_covers_the_answer_and_its_first_eos_only(train_demo: ModuleType) -> None:
    ids, resp, logits = _rows()
    masked = resp.clone()
    ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")  # (rows, positions)
    answer = torch.tensor([[0, 1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    weight = torch.where(answer, 8.0, 1.0)
    expected = (ce[masked] * weight[masked]).sum() / weight[masked].sum()
    got = train_demo.masked_loss(logits, ids, masked, resp, EOS, 8.0)
    assert torch.allclose(got, expected)
    # only masked positions count: unmasking the answer leaves the tail's plain mean
    tail_only = masked & ~answer
    assert torch.allclose(train_demo.masked_loss(logits, ids, tail_only, resp, EOS, 8.0), ce[tail_only].mean())


def test_revealed_tail_masks_the_tail_less_than_the_answer(train_demo: ModuleType, tmp_path: Path) -> None:
    from seer_deploy.models.text.tokenizer import Tokenizer

    train_demo.write_tokenizer(tmp_path / "tokenizer.json")
    cfg = train_demo.demo_config()
    tok = Tokenizer(tmp_path / "tokenizer.json", cfg.eos_id)
    ids, _, resp, rate = train_demo.make_batch(random.Random(0), tok, cfg, 64, revealed_tail=1.0)
    with_tail = tail_lower = 0
    for i in range(ids.shape[0]):
        pos = resp[i].nonzero().flatten()
        row = ids[i, pos]
        n_answer = int((row != cfg.eos_id).sum())
        answer_rate, tail_rate = rate[i, pos[:n_answer]], rate[i, pos[n_answer:]]
        assert torch.all(tail_rate <= answer_rate.max() + 1e-7)
        with_tail += bool(tail_rate.numel())
        tail_lower += bool(tail_rate.numel() and tail_rate.max() < answer_rate.max())
    assert with_tail > 32 and tail_lower == with_tail  # every row with a tail: the answer's rate times r < 1
    _, _, _, plain = train_demo.make_batch(random.Random(0), tok, cfg, 64)
    assert torch.all(plain == plain[:, :1])  # without it, one rate per row


def test_ema_moves_each_weight_toward_the_model_by_one_minus_decay(train_demo: ModuleType) -> None:
    model = torch.nn.Linear(3, 2)
    model.register_buffer("count", torch.tensor(7))  # integer buffers are copied, not averaged
    ema = {name: value.detach().clone() for name, value in model.state_dict().items()}
    before = {name: value.clone() for name, value in ema.items()}
    with torch.no_grad():
        model.weight.add_(1.0)
        model.count.fill_(9)
    train_demo.update_ema(ema, model, 0.75)
    assert torch.allclose(ema["weight"], before["weight"] + 0.25)
    assert torch.equal(ema["bias"], before["bias"])  # unchanged weights stay put
    assert int(ema["count"]) == 9
    train_demo.update_ema(ema, model, 0.0)  # decay 0: the model's own weights
    assert torch.equal(ema["weight"], model.weight)
