"""Train the bundled demo checkpoint: a small LLaDA-style mask predictor on the demo's synthetic tasks.

LLaDA's SFT objective: the prompt is never masked; every response position (answer and EOS padding) is masked with
probability t ~ U(0, 1); cross-entropy on the masked positions. Two lessons of the feasibility study are built in:
  * EOS tails of varying length: each example gets a random number of response slots G between its answer length
    and the batch's slot count (up to 256, or --gen-length); slots past G are padding, excluded from attention and
    loss (LLaDA's pad-to-batch-max). Without this, any truncation broke the model.
  * A wide MLP (1024 hidden units) so per-position sparsity fractions are not drowned in sampling noise.

    python scripts/train_demo.py --out seer_deploy/models/demos/demo      # about 30 minutes on 2 CPU cores

Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint, save_checkpoint
from seer_deploy.models.demos.demo_tasks import (
    MAX_ANSWER_TOKENS,
    TASKS,
    VOCAB,
    heldout_examples,
    sample_example,
    write_tokenizer,
)
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.text.tokenizer import Tokenizer
from seer_deploy.runtime.reference import generate

MAX_GEN_LENGTH = 256
# Slot counts per batch (and their weights): mostly short batches, enough long ones to learn long EOS tails.
SLOT_CHOICES = (48, 96, 160, 256)
SLOT_WEIGHTS = (0.55, 0.2, 0.1, 0.15)
SHORT_TAIL_MAX = 16
PROMPT_ROOM = 64  # positions for the prompt (at most MAX_PROMPT_TOKENS = 35) in front of the response slots


def slot_choices(gen_length: int) -> tuple[int, ...]:
    """The batch slot counts for responses of up to gen_length slots: SLOT_CHOICES, plus gen_length itself above 256."""
    return SLOT_CHOICES + ((gen_length,) if gen_length > MAX_GEN_LENGTH else ())


def demo_config(gen_length: int = MAX_GEN_LENGTH) -> ModelConfig:
    ids = {tok: i for i, tok in enumerate(VOCAB)}
    return ModelConfig(
        vocab_size=len(VOCAB),
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        mlp_hidden=1024,
        max_seq_len=gen_length + PROMPT_ROOM,  # 320 at the default 256
        rope_theta=10000.0,
        mask_id=ids["<|mdm_mask|>"],
        eos_id=ids["<|endoftext|>"],
        pad_id=ids["<|endoftext|>"],
        bos_id=ids["<|startoftext|>"],
    )


def make_batch(
    rng: random.Random,
    tok: Tokenizer,
    cfg: ModelConfig,
    batch: int,
    short_tail: float = 0.0,
    slot_weights: tuple[float, ...] = SLOT_WEIGHTS,
    task_weights: tuple[float, ...] | None = None,
    revealed_tail: float = 0.0,
    slot_counts: tuple[int, ...] = SLOT_CHOICES,
) -> tuple[torch.Tensor, ...]:
    """ids, attention mask, response mask (positions that may be masked and carry loss), and the mask rate per position.

    short_tail: the share of rows whose response is the answer plus only 0 to SHORT_TAIL_MAX EOS slots, what a
    response looks like after Seer cut it; without them the model answered differently when little padding was left.
    revealed_tail: the share of rows whose EOS tail is masked at a lower rate than the answer (t * r, r = 0 for half
    of them, else U(0, 1)). Low-confidence decoding commits the EOS tail first: in traced 256-slot runs, all but 0 to
    4 of some 230 tail slots (31 on one of six prompts) were EOS when the answer's first token was written, a state
    uniform masking (one t per row) almost never shows the model. Its errors at full length were made there.
    """
    slots = rng.choices(slot_counts, slot_weights)[0]
    rows = []
    for _ in range(batch):
        ex = sample_example(rng, rng.choices(TASKS, task_weights)[0] if task_weights else None)
        prompt = tok.encode_prompt(ex.prompt)
        answer = tok.encode_prompt(ex.answer)[1:-1] if ex.answer else []  # strip BOS and '='
        if rng.random() < short_tail:
            g = min(slots, max(len(answer), 1) + rng.randint(0, SHORT_TAIL_MAX))
        else:
            g = rng.randint(max(len(answer), 1), slots) if rng.random() < 0.5 else slots
        response = answer + [cfg.eos_id] * (g - len(answer))
        rows.append((prompt, response))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((batch, width), cfg.eos_id, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    resp = torch.zeros((batch, width), dtype=torch.bool)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        attn[i, : len(p) + len(r)] = 1
        resp[i, len(p) : len(p) + len(r)] = True
    t = torch.rand(batch, 1, generator=torch.Generator().manual_seed(rng.getrandbits(31))).clamp_min(1e-3)
    rate = t.expand(batch, width).clone()
    if revealed_tail > 0:  # no extra draws otherwise: earlier stages replay exactly
        for i, (p, r) in enumerate(rows):
            if rng.random() < revealed_tail:
                n_answer = next((j for j, tok_id in enumerate(r) if tok_id == cfg.eos_id), len(r))
                scale = 0.0 if rng.random() < 0.5 else rng.random()
                rate[i, len(p) + n_answer :] *= scale
    return ids, attn, resp, rate


def masked_loss(logits: torch.Tensor, ids: torch.Tensor, masked: torch.Tensor, resp: torch.Tensor, eos_id: int,
                answer_weight: float) -> torch.Tensor:
    """Cross-entropy on the masked positions; answer positions (and the first EOS, where the answer ends) weigh
    `answer_weight` times a tail position. At 256 slots the tail is most of the masked positions and nearly free to
    predict, so with equal weights the answer's copy errors, where the demo goes wrong at full length, carry little
    of the gradient."""
    if answer_weight == 1.0:
        return F.cross_entropy(logits[masked].float(), ids[masked])
    eos_seen = torch.cumsum((ids == eos_id) & resp, dim=1)
    weight = torch.where(resp & (eos_seen <= 1), answer_weight, 1.0)[masked]
    ce = F.cross_entropy(logits[masked].float(), ids[masked], reduction="none")
    return (ce * weight).sum() / weight.sum()


def update_ema(ema: dict[str, torch.Tensor], model: torch.nn.Module, decay: float) -> None:
    """ema <- decay * ema + (1 - decay) * weights; with --ema the averaged weights are saved. The demo's remaining
    errors are rare (about one answer in a hundred), the size of the step-to-step noise of the weights, which
    averaging damps without another training step. (Not measured apart from the stage that first used it.)"""
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                ema[name].lerp_(value, 1.0 - decay)
            else:
                ema[name].copy_(value)


def evaluate(model: MaskPredictor, tok: Tokenizer, n: int, gen_length: int) -> float:
    examples = heldout_examples(n)
    model.eval()
    out = generate(
        model, [tok.encode_prompt(e.prompt) for e in examples], GenerationConfig(gen_length=gen_length, steps=gen_length)
    )
    model.train()
    hits = sum(tok.decode_answer(row.tolist()) == e.answer for row, e in zip(out.tokens, examples, strict=True))
    return hits / n


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("seer_deploy/models/demos/demo"))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--short-tail", type=float, default=0.0,
                    help="share of rows with only 0-16 EOS slots after the answer (as after a Seer cut)")
    ap.add_argument("--revealed-tail", type=float, default=0.0,
                    help="share of rows whose EOS tail is masked less than the answer (as when decoding the answer)")
    ap.add_argument("--init-from", type=Path, default=None, help="continue from this checkpoint's weights")
    ap.add_argument("--gen-length", type=int, default=MAX_GEN_LENGTH,
                    help=f"most response slots (default {MAX_GEN_LENGTH}); above {MAX_GEN_LENGTH} it is one more batch "
                         f"slot count (--slot-weights then needs {len(SLOT_CHOICES) + 1} numbers) and the model's "
                         f"max_sequence_length is it + {PROMPT_ROOM}")
    ap.add_argument("--slot-weights", type=_floats, default=None,
                    help=f"weights of the batch slot counts {SLOT_CHOICES} (+ --gen-length above {MAX_GEN_LENGTH}; "
                         f"default {SLOT_WEIGHTS})")
    ap.add_argument("--task-weights", type=_floats, default=None,
                    help=f"weights of the tasks {TASKS} (default: uniform)")
    ap.add_argument("--answer-weight", type=float, default=1.0,
                    help="loss weight of the answer and its first EOS against the rest of the EOS tail (default 1: "
                         "every masked position alike)")
    ap.add_argument("--ema", type=float, default=0.0,
                    help="save an exponential moving average of the weights with this decay per step, e.g. 0.998 "
                         "(default 0: the last step's weights)")
    args = ap.parse_args()
    if args.gen_length < MAX_GEN_LENGTH:
        ap.error(f"--gen-length below {MAX_GEN_LENGTH} is not supported (the batch slot counts go up to it)")
    slots = slot_choices(args.gen_length)
    if args.slot_weights is None:
        if len(slots) != len(SLOT_WEIGHTS):
            ap.error(f"--gen-length {args.gen_length} needs --slot-weights: {len(slots)} numbers, one per slot count "
                     f"{slots}")
        args.slot_weights = SLOT_WEIGHTS
    if len(args.slot_weights) != len(slots):
        ap.error(f"--slot-weights needs {len(slots)} numbers, one per slot count {slots}")
    if not 0.0 <= args.ema < 1.0:
        ap.error("--ema needs a decay in [0, 1)")
    if args.task_weights is not None and len(args.task_weights) != len(TASKS):
        ap.error(f"--task-weights needs {len(TASKS)} numbers, one per task {TASKS}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg = demo_config(args.gen_length)
    tmp = Path(tempfile.mkdtemp())
    write_tokenizer(tmp / "tokenizer.json")
    tok = Tokenizer(tmp / "tokenizer.json", cfg.eos_id)
    model = MaskPredictor(cfg)
    if args.init_from is not None:
        model.load_state_dict(load_checkpoint(args.init_from).model.state_dict())
        model.requires_grad_(True).train()
    print(f"demo model: {model.num_parameters() / 1e6:.2f}M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = 100

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    ema = {name: value.detach().clone() for name, value in model.state_dict().items()} if args.ema else None
    start = time.time()
    for step in range(args.steps):
        ids, attn, resp, rate = make_batch(
            rng, tok, cfg, args.batch, args.short_tail, args.slot_weights, args.task_weights, args.revealed_tail, slots
        )
        masked = resp & (torch.rand(ids.shape) < rate)
        noisy = torch.where(masked, torch.full_like(ids, cfg.mask_id), ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(noisy, attn).logits
        loss = masked_loss(logits, ids, masked, resp, cfg.eos_id, args.answer_weight)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if ema is not None:
            update_ema(ema, model, args.ema)
        if step % 50 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  {time.time() - start:6.0f}s", flush=True)
        if args.eval_every and step and step % args.eval_every == 0:
            print(f"  held-out exact match (100 prompts, gen 48): {evaluate(model, tok, 100, 48):.3f}", flush=True)

    minutes = (time.time() - start) / 60
    if ema is not None:
        model.load_state_dict(ema)
    acc64 = evaluate(model, tok, 200, 64)
    print(f"trained {args.steps} steps in {minutes:.1f} min; held-out exact match at gen_length 64: {acc64:.3f}")
    init = f" --init-from {args.init_from}" if args.init_from else ""
    if args.gen_length != MAX_GEN_LENGTH:
        init += f" --gen-length {args.gen_length}"
    init += " --slot-weights " + ",".join(map(str, args.slot_weights))
    if args.revealed_tail:
        init += f" --revealed-tail {args.revealed_tail}"
    if args.task_weights:
        init += " --task-weights " + ",".join(map(str, args.task_weights))
    if args.answer_weight != 1.0:
        init += f" --answer-weight {args.answer_weight}"
    if args.ema:
        init += f" --ema {args.ema}"
    card = f"""# seer-deploy demo checkpoint

A {model.num_parameters() / 1e6:.2f}M-parameter LLaDA-style mask predictor ({cfg.n_layers} layers, d_model {cfg.d_model},
{cfg.n_heads} heads, SwiGLU MLP {cfg.mlp_hidden}) trained from scratch by this project on synthetic digit tasks
(`reverse`, `sort`, `filter`, `double`, `count`; answers of 1 to {MAX_ANSWER_TOKENS} tokens, then EOS to the end).
Stored in LLaDA's original layout (config.json field names and `model.transformer.blocks.N...` weights).

Training: `python scripts/train_demo.py --steps {args.steps} --batch {args.batch} --lr {args.lr} --seed {args.seed} \\
--threads {args.threads} --short-tail {args.short_tail}{init}` ({minutes:.1f} minutes on {args.threads} CPU threads). LLaDA's SFT objective with EOS tails of
varying length (up to {args.gen_length} response slots).

Held-out exact match (reference loop, 200 prompts, steps = gen_length, block_length = gen_length, temperature 0):
gen_length 64: {acc64:.3f}. Prompts look like `reverse 31415` (the tokenizer adds BOS and `=`).
"""
    save_checkpoint(model, args.out, "llada", tokenizer_file=tmp / "tokenizer.json", extra_files={"README.md": card})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
