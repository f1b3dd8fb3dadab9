"""Train the bundled multimodal demo (`demo-vl`): a tiny SigLIP tower, projector and LLaDA-style LM, trained together.

The task (seer_deploy.models.demos.demo_vl_tasks): pictures of 1-4 coloured shapes, questions whose answers are 1 to 8
tokens. The objective is the text demo's (scripts/train_demo.py): LLaDA's SFT loss, the prompt (image included) is
never masked, every response position (answer and EOS padding) is masked with probability t ~ U(0, 1), cross-entropy
on the masked positions, and EOS tails of varying length (half the rows get a random number of response slots
between the answer length and the batch's slot count; slots past it are padding, out of attention and loss).

The image reaches the LM exactly as at inference: `<image>` expands to image ids that index the batch's image table
(`seer_deploy.models.networks.image_prompts.embed_with_images`), so training and generation share one code path.

After training, Seer is calibrated for the model (seer_deploy.calibration, the library `seer-deploy calibrate` uses, on
pictures drawn from a calibration seed) and the config is stored as the checkpoint's seer.json; the card reports exact match and Seer's safe / identical rates on the
held-out pictures.

    python scripts/train_demo_vl.py --out seer_deploy/models/demos/demo_vl     # about 17 minutes on 2 CPU cores
    python scripts/train_demo_vl.py --out seer_deploy/models/demos/demo_vl --calibrate-only   # recalibrate Seer only
    python scripts/train_demo_vl.py --out seer_deploy/models/demos/demo_vl --report-only      # measure its seer.json

Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from seer_deploy.calibration.collect import batched_generation, full_generation, stop_ids
from seer_deploy.calibration.detector_fit import CalibrationOptions, calibrate_model
from seer_deploy.calibration.identity_fit import IdentityGoal, fit_identity_margin
from seer_deploy.calibration.prompt_set import prepare_image_prompts
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.checkpoints.multimodal import load_multimodal
from seer_deploy.models.checkpoints.multimodal_writer import save_multimodal_checkpoint
from seer_deploy.models.demos.demo_vl_tasks import (
    HELDOUT_SEED,
    IMAGE_SIZE,
    MAX_ANSWER_TOKENS,
    VOCAB,
    PictureExample,
    heldout_examples,
    sample_example,
    write_tokenizer,
)
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.image_prompts import ImageConditionedModel, embed_with_images
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.vision import VisionConfig, VisionEncoder
from seer_deploy.models.pictures.image import ImageConfig, pixel_batch
from seer_deploy.models.prompts.image_placeholders import MultimodalTokenizer, expand_placeholders
from seer_deploy.models.prompts.prompt import Prompt
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import CHECKPOINT_CONFIG_NAME, SeerConfig
from seer_deploy.seer.metrics import true_lengths

MAX_GEN_LENGTH = 64
SLOT_CHOICES = (16, 32, 64)
SLOT_WEIGHTS = (0.5, 0.3, 0.2)


def demo_vl_configs() -> tuple[ModelConfig, VisionConfig]:
    ids = {tok: i for i, tok in enumerate(VOCAB)}
    lm = ModelConfig(
        vocab_size=len(VOCAB),
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        mlp_hidden=512,
        max_seq_len=96,
        rope_theta=10000.0,
        mask_id=ids["<|mdm_mask|>"],
        eos_id=ids["<|endoftext|>"],
        pad_id=ids["<|endoftext|>"],
        bos_id=ids["<|startoftext|>"],
    )
    vision = VisionConfig(
        siglip={
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 3,  # LLaVA's second-to-last layer: 2 layers run
            "num_attention_heads": 4,
            "num_channels": 3,
            "image_size": IMAGE_SIZE,
            "patch_size": 16,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
        },
        lm_hidden_size=lm.d_model,
        mm_hidden_size=64,
        image=ImageConfig(image_size=IMAGE_SIZE, aspect="pad"),
        select_layer=-2,
        projector_type="mlp2x_gelu",
        patch_merge_type="flat",
    )
    return lm, vision


def make_batch(
    rng: random.Random, tok: MultimodalTokenizer, cfg: ModelConfig, vcfg: VisionConfig, batch: int
) -> tuple[torch.Tensor, ...]:
    """pixels, ids (image ids index this batch's image table), attention mask, response mask, t per row."""
    slots = rng.choices(SLOT_CHOICES, SLOT_WEIGHTS)[0]
    examples = [sample_example(rng) for _ in range(batch)]
    prompts = expand_placeholders(
        [tok.encode_prompt(ex.prompt) for ex in examples], [1] * batch, vcfg.tokens_per_image,
        vcfg.image_token_index, cfg.n_embed_rows,
    )
    rows = []
    for ex, prompt in zip(examples, prompts, strict=True):
        answer = tok.encode_prompt(ex.answer)[1:-1]  # strip BOS and '='
        g = rng.randint(len(answer), slots) if rng.random() < 0.5 else slots
        rows.append((prompt, answer + [cfg.eos_id] * (g - len(answer))))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((batch, width), cfg.eos_id, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    resp = torch.zeros((batch, width), dtype=torch.bool)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        attn[i, : len(p) + len(r)] = 1
        resp[i, len(p) : len(p) + len(r)] = True
    pixels = torch.from_numpy(pixel_batch([ex.image() for ex in examples], vcfg.image))
    t = torch.rand(batch, 1, generator=torch.Generator().manual_seed(rng.getrandbits(31))).clamp_min(1e-3)
    return pixels, ids, attn, resp, t


@torch.no_grad()
def conditioned(
    lm: MaskPredictor, vision: VisionEncoder, tok: MultimodalTokenizer, examples: list[PictureExample]
) -> tuple[ImageConditionedModel, list[list[int]]]:
    """The LM holding these pictures' image table, and the prompts whose image ids point into it."""
    vcfg = vision.cfg
    prompts = expand_placeholders(
        [tok.encode_prompt(e.prompt) for e in examples], [1] * len(examples), vcfg.tokens_per_image,
        vcfg.image_token_index, lm.cfg.n_embed_rows,
    )
    table = vision(torch.from_numpy(pixel_batch([e.image() for e in examples], vcfg.image))).reshape(-1, lm.cfg.d_model)
    return ImageConditionedModel(lm, table.float()), prompts


@torch.no_grad()
def evaluate(lm: MaskPredictor, vision: VisionEncoder, tok: MultimodalTokenizer, n: int, gen_length: int) -> float:
    """Held-out exact match with the reference loop (steps = gen_length, one block, temperature 0)."""
    lm.eval()
    vision.eval()
    examples = heldout_examples(n)
    model, prompts = conditioned(lm, vision, tok, examples)
    out = generate(model, prompts, GenerationConfig(gen_length=gen_length, steps=gen_length))
    lm.train()
    vision.train()
    return sum(tok.decode_answer(row.tolist()) == e.answer for row, e in zip(out.tokens, examples, strict=True)) / n


@torch.no_grad()
def calibrate_seer(lm: MaskPredictor, vision: VisionEncoder, tok: MultimodalTokenizer, n: int,
                   target_identical: float) -> SeerConfig:
    """Seer's settings for this model, chosen on pictures of a calibration seed (never the held-out one): the
    detector's floors and a safe margin (calibration.detector_fit), then the margin fitted end to end, the first whose
    answers equal full length's on `target_identical` of the pictures (calibration.identity_fit)."""
    examples = heldout_examples(n, seed=HELDOUT_SEED + 1)
    config = GenerationConfig(gen_length=MAX_GEN_LENGTH, steps=MAX_GEN_LENGTH)
    prompts = [Prompt(e.prompt, (e.image(),)) for e in examples]
    prepared = prepare_image_prompts(lm.eval(), vision.eval(), tok, prompts, config, batch_size=n)
    model, ids = prepared.model, prepared.ids
    full = full_generation(model, ids, config, batch_size=n)
    result = calibrate_model(prepared.source, ids, config, CalibrationOptions(), full_tokens=full, batch_size=n)
    safe = result.config
    fit = fit_identity_margin(lambda seer: batched_generation(model, ids, config, seer=seer, batch_size=n), safe, full,
                              true_lengths(full, stop_ids(lm.cfg)),
                              range(safe.margin, safe.margin + MAX_ANSWER_TOKENS + 1),
                              IdentityGoal(target_identical), log=lambda line: print(line, flush=True))
    return safe.with_(margin=fit.margin, calibration=result.report | {
        "prompts": f"{n} demo-vl pictures, seed HELDOUT_SEED + 1 (not the held-out evaluation pictures)",
        "safe_margin": safe.margin, "identity_margin": fit.to_dict()})


@torch.no_grad()
def seer_report(
    lm: MaskPredictor, vision: VisionEncoder, tok: MultimodalTokenizer, seer: SeerConfig, n: int
) -> dict[str, Any]:
    """Held-out: exact match at full length and with Seer, safe rate (kept >= the full answer's length),
    identical rate (Seer's tokens equal full length's up to and including the first EOS), work done."""
    examples = heldout_examples(n)
    model, prompts = conditioned(lm.eval(), vision.eval(), tok, examples)
    config = GenerationConfig(gen_length=MAX_GEN_LENGTH, steps=MAX_GEN_LENGTH)
    full = generate(model, prompts, config)
    cut = generate(model, prompts, config, seer=seer)
    full_tokens, cut_tokens = full.tokens.numpy(), cut.tokens.numpy()
    true_len = true_lengths(full_tokens, {lm.cfg.eos_id})
    kept = np.array([r.kept for r in cut.seer or []])
    upto = np.minimum(true_len + 1, MAX_GEN_LENGTH)
    identical = [np.array_equal(cut_tokens[i, : upto[i]], full_tokens[i, : upto[i]]) for i in range(n)]

    def exact(tokens: np.ndarray) -> float:
        return float(np.mean([tok.decode_answer(t.tolist()) == e.answer for t, e in zip(tokens, examples, strict=True)]))

    return {
        "pictures": n,
        "gen_length": MAX_GEN_LENGTH,
        "detector": seer.detector,
        "margin": seer.margin,
        "exact_full": exact(full_tokens),
        "exact_seer": exact(cut_tokens),
        "safe": float(np.mean(kept >= true_len)),
        "identical": float(np.mean(identical)),
        "mean_kept": float(kept.mean()),
        "mean_true_length": float(true_len.mean()),
        "boundary_exact": float(np.mean([r.boundary == n for r, n in zip(cut.seer or [], true_len, strict=True)])),
        "tokens_processed_vs_full": cut.tokens_processed / full.tokens_processed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("seer_deploy/models/demos/demo_vl"))
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--calibration-pictures", type=int, default=400)
    ap.add_argument("--eval-pictures", type=int, default=400, help="Held-out pictures for the final report.")
    ap.add_argument("--target-identical", type=float, default=0.995,
                    help="Share of calibration pictures whose Seer answer must equal full length's.")
    ap.add_argument("--calibrate-only", action="store_true", help="Recalibrate Seer for the checkpoint at --out.")
    ap.add_argument("--report-only", action="store_true",
                    help="Measure the checkpoint at --out with its seer.json on the held-out pictures; write nothing.")
    ap.add_argument("--init-from", type=Path, default=None, help="Continue from this demo-vl checkpoint's weights.")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.report_only:
        loaded = load_multimodal(args.out)
        seer = SeerConfig.load(args.out / CHECKPOINT_CONFIG_NAME)
        tok = MultimodalTokenizer.for_checkpoint(loaded)
        print(json.dumps(seer_report(loaded.lm.model, loaded.vision, tok, seer, args.eval_pictures), indent=1))
        return
    if args.calibrate_only:
        loaded = load_multimodal(args.out)
        tok = MultimodalTokenizer.for_checkpoint(loaded)
        seer = calibrate_seer(loaded.lm.model, loaded.vision, tok, args.calibration_pictures, args.target_identical)
        seer.save(args.out / CHECKPOINT_CONFIG_NAME)
        print(json.dumps(seer_report(loaded.lm.model, loaded.vision, tok, seer, args.eval_pictures), indent=1))
        print(f"wrote {args.out / CHECKPOINT_CONFIG_NAME}")
        return
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    cfg, vcfg = demo_vl_configs()
    tmp = Path(tempfile.mkdtemp())
    write_tokenizer(tmp / "tokenizer.json")
    tok = MultimodalTokenizer(tmp / "tokenizer.json", cfg.eos_id, None, vcfg.image_token_index)
    lm, vision = MaskPredictor(cfg), VisionEncoder(vcfg)
    if args.init_from is not None:
        start_from = load_multimodal(args.init_from)
        lm.load_state_dict(start_from.lm.model.state_dict())
        vision.load_state_dict(start_from.vision.state_dict())
    lm.train()
    vision.train()
    params = list(lm.parameters()) + list(vision.parameters())
    n_lm, n_vision = lm.num_parameters(), vision.num_parameters()
    print(f"demo-vl: LM {n_lm / 1e6:.2f}M + vision {n_vision / 1e6:.2f}M parameters", flush=True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = 100

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    start = time.time()
    for step in range(args.steps):
        pixels, ids, attn, resp, t = make_batch(rng, tok, cfg, vcfg, args.batch)
        masked = resp & (torch.rand(ids.shape) < t)
        noisy = torch.where(masked, torch.full_like(ids, cfg.mask_id), ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            table = vision(pixels).reshape(-1, cfg.d_model)
            logits = lm(attention_mask=attn, inputs_embeds=embed_with_images(lm.embed, noisy, table)).logits
        loss = F.cross_entropy(logits[masked].float(), ids[masked])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  {time.time() - start:6.0f}s", flush=True)
        if args.eval_every and step and step % args.eval_every == 0:
            print(f"  held-out exact match (100 pictures, gen 32): {evaluate(lm, vision, tok, 100, 32):.3f}", flush=True)

    minutes = (time.time() - start) / 60
    acc64 = evaluate(lm, vision, tok, args.eval_pictures, MAX_GEN_LENGTH)
    print(f"trained {args.steps} steps in {minutes:.1f} min; held-out exact match at gen_length 64: {acc64:.3f}")
    seer = calibrate_seer(lm, vision, tok, args.calibration_pictures, args.target_identical)
    report = seer_report(lm, vision, tok, seer, args.eval_pictures)
    print(f"seer: {json.dumps(report)}", flush=True)
    s = vcfg.siglip
    init = f" --init-from {args.init_from}" if args.init_from else ""
    card = f"""# seer-deploy demo-vl checkpoint

A multimodal LLaDA-V-style model trained from scratch by this project: a SigLIP vision tower ({s['num_hidden_layers']}
layers configured, features from layer {vcfg.select_layer} so {vcfg.layers_to_run} run; width {s['hidden_size']}, patch
{s['patch_size']}, {s['image_size']} px), an `{vcfg.projector_type}` projector and a {n_lm / 1e6:.2f}M-parameter
LLaDA-style mask predictor ({cfg.n_layers} layers, d_model {cfg.d_model}, SwiGLU MLP {cfg.mlp_hidden}); {n_vision / 1e6:.2f}M
vision parameters. Stored in LLaDA-V's layout (Llama-style LM names, `model.vision_tower.vision_tower.vision_model.*`,
`model.mm_projector.*`, LLaVA's `mm_*` config keys).

Task (`seer_deploy/models/demos/demo_vl_tasks.py`): 64 px pictures of 1 to 4 coloured shapes (square, circle,
triangle; six colours, tinted at random), one per 16 px column, in a random row; prompts `<image> colors|shapes|describe|count`;
answers of 1 to {MAX_ANSWER_TOKENS} tokens, then EOS to the end.

Training: `python scripts/train_demo_vl.py --steps {args.steps} --batch {args.batch} --lr {args.lr} --seed {args.seed} \\
--threads {args.threads} --eval-every {args.eval_every}{init}` ({minutes:.1f} minutes on {args.threads} CPU threads). LLaDA's SFT objective with EOS tails of
varying length (up to {MAX_GEN_LENGTH} response slots), vision tower, projector and LM trained together.

Held-out exact match (reference loop, {args.eval_pictures} pictures, steps = gen_length = block_length = 64, temperature
0): {acc64:.3f}.

Seer (`seer.json`, calibrated on {args.calibration_pictures} pictures of another seed; detector `{seer.detector}`, margin
{seer.margin}) on the {args.eval_pictures} held-out pictures at gen_length 64: safe {report['safe']:.3f}, answers identical to full
length {report['identical']:.3f}, exact match {report['exact_seer']:.3f} (full length {report['exact_full']:.3f}), mean kept
{report['mean_kept']:.1f} of 64 slots, {report['tokens_processed_vs_full']:.2f}x the tokens processed at full length.
"""
    seer_json = json.dumps(seer.to_dict(), indent=1) + "\n"
    save_multimodal_checkpoint(
        lm, vision, args.out, tokenizer_file=tmp / "tokenizer.json",
        extra_files={"README.md": card, CHECKPOINT_CONFIG_NAME: seer_json},
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
