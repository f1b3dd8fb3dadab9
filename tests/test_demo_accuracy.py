"""The committed demo checkpoint really solves its tasks with the reference loop (LLaDA's one-token-per-step setting).

The issue's bar is 97% of 200 held-out prompts at gen_length 64 and 256. On 2 CPU cores the full-length loop at 256
costs about 2.5 s per step for 200 prompts (14 minutes), so CI checks all 200 at 64 (against the bar itself) and the
first 16 at 256 (0.75 s a step on one core for 25 prompts: 3 minutes of CI's 35 were this one test; one miss there is
0.9375, so that floor allows one); the 200-prompt figure at 256 is measured by `scripts/seer_study.py`
(docs/seer-study.md, full-length row).
"""

from __future__ import annotations

import pytest
from conftest import requires_demo

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint, resolve_checkpoint
from seer_deploy.models.demos.demo_tasks import TASKS, heldout_examples
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import CHECKPOINT_CONFIG_NAME, SeerConfig
from seer_deploy.seer.metrics import identical_share, true_lengths

pytestmark = [requires_demo, pytest.mark.slow]
# Measured (demo after stage 7): 0.990 on the 200 prompts at 64, 0.96 (24 of 25) on the first 25 at 256.
MEASURED_FLOORS = {64: 0.97, 256: 0.92}

DEMO_SEER_FILE = resolve_checkpoint("demo") / CHECKPOINT_CONFIG_NAME  # the demo's shipped Seer config


@pytest.mark.parametrize("gen_length, n_prompts", [(64, 200), (256, 16)])
def test_demo_answers_held_out_prompts(gen_length: int, n_prompts: int) -> None:
    ckpt = load_checkpoint("demo")
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id)
    examples = heldout_examples(n_prompts)
    assert {e.task for e in examples} == set(TASKS)
    prompts = [tok.encode_prompt(e.prompt) for e in examples]
    config = GenerationConfig(gen_length, gen_length)
    out = generate(ckpt.model, prompts, config)
    answers = [tok.decode_answer(row.tolist()) for row in out.tokens]
    exact = sum(a == e.answer for a, e in zip(answers, examples, strict=True)) / len(examples)
    assert exact >= MEASURED_FLOORS[gen_length], f"exact match {exact:.3f} at gen_length {gen_length}"
    # The tail really is EOS padding, as LLaDA's SFT data taught: Seer has something to cut.
    eos_share = float((out.tokens == ckpt.config.eos_id).float().mean())
    assert eos_share > 0.5

    # The shipped Seer config answers as full length does. Full length commits the EOS tail before the answer, and
    # the answer is then written with the whole tail in view; the paper's cut drops it, and 2.4% of the answers
    # change (docs/seer-study.md). The calibration's end-to-end fit found no margin that fixes that and kept the cut
    # tail in the input as committed EOS (tail_context 'all'): token for token full length's on all 500 held-out
    # prompts at 256.
    seer = SeerConfig.load(DEMO_SEER_FILE)
    assert seer.tail_context == seer.calibration["identity_margin"]["tail_context"]
    n = min(64, n_prompts)
    full = out.tokens[:n].numpy()
    with_tail = generate(ckpt.model, prompts[:n], config, seer=seer)
    assert with_tail.seer is not None and any(r.context > 0 for r in with_tail.seer)  # answers were cut
    tokens = with_tail.tokens.numpy()
    assert identical_share(tokens, full, true_lengths(full, {ckpt.config.eos_id})) == 1.0
