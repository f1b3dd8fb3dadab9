"""The rows of the benchmark: one way of answering a batch of requests each, behind one call signature.

Every row answers the same requests at the same settings (greedy, steps = gen_length, one block) and returns the
response ids with what they cost, so the harness can time, score and compare them the same way. The rows users run
go through the generation service (`seer_deploy.service`), as `seer-deploy generate` does; the reference is LLaDA's
loop itself, and the oracle a study the service does not offer:

  reference   `reference.generate` in torch eager at full length: what users run today
  ort-full    the runtime loop on ONNX Runtime at full length
  ort-parallel   ONNX Runtime at full length with Fast-dLLM's threshold rule (blocks of --fast-block-length), no cache
  ort-fastdllm   Fast-dLLM's recipe on ONNX Runtime: the threshold rule and the block-wise dual KV cache
  ort-seer    the runtime loop on ONNX Runtime with Seer (step zero at full length, then each row cut)
  ort-seer-fast  Seer's cut, then the threshold rule and the dual KV cache on what is kept
  ort-seer-progressive  ort-seer-fast with progressive step zero (a short first canvas; full length where it misses)
  ort-oracle  ONNX Runtime told each answer's true length before it starts: every step, the first included, runs on
              prompt + that length (no detector can beat it)
  ort-seer-tail  ONNX Runtime with Seer and the tail context of `bench --tail-context` in place of the config's:
              the same cut and steps, that many cut slots in view as committed EOS
  ort-int8-seer / ort-int4-seer (and -fast)  ort-seer (and ort-seer-fast) on an export quantized to 8 / 4 bits
  torch-seer  the runtime loop on torch eager with Seer
  trt-full / trt-seer  the same on a TensorRT engine, when a GPU and TensorRT are present
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.runtime.loop import run_planned
from seer_deploy.runtime.reference import generate
from seer_deploy.seer.config import SeerConfig
from seer_deploy.seer.plan import BlockPlan, TruncationPlan, block_plan
from seer_deploy.service import Prompt, Service

ROW_NAMES: tuple[str, ...] = (
    "reference", "ort-full", "ort-parallel", "ort-fastdllm", "ort-seer", "ort-seer-fast", "ort-seer-tail", "ort-oracle",
    "ort-int8-seer", "ort-int8-seer-fast", "ort-int4-seer", "ort-int4-seer-fast", "torch-seer", "trt-full", "trt-seer",
)
FAST_ROWS = ("ort-parallel", "ort-fastdllm", "ort-seer-fast", "ort-seer-progressive", "ort-int8-seer-fast",
             "ort-int4-seer-fast")  # the rows that run `BenchSettings.fast_config`
ROW_DESCRIPTIONS: dict[str, str] = {
    "reference": "the LLaDA-style loop (`reference.generate`) in torch eager at full gen_length: what users run today",
    "ort-full": "the runtime loop (`run_generation`) on ONNX Runtime at full gen_length, no Seer",
    "ort-parallel": "ONNX Runtime at full gen_length with Fast-dLLM's threshold rule (each step commits every "
    "candidate of its block at or above the threshold, at least one; blocks of the bench's fast block length), no cache",
    "ort-fastdllm": "Fast-dLLM's recipe on ONNX Runtime: the threshold rule and the block-wise dual KV cache (each "
    "block's first step a full pass that refreshes the keys and values, its other steps run only the block)",
    "ort-seer-fast": "Seer's cut after step zero, then the threshold rule and the dual KV cache on the kept length "
    "(and the config's tail context, whose keys and values cost only the refresh passes)",
    "ort-seer-progressive": "ort-seer-fast with progressive step zero: step zero first on a canvas of the bench's "
    "--first-canvas slots, planned from it where the answer's end lies inside, at full gen_length only for the rows "
    "where it does not (the answers are then those of a shorter canvas: compare its exact and = full columns)",
    "ort-seer": "ONNX Runtime with Seer as configured: step zero at full length, then each answer cut to its "
    "detected end + margin (the config's tail context, if any, kept in view as committed EOS) and the rows scheduled "
    "by the batch scheduler",
    "ort-seer-tail": "ONNX Runtime with Seer's cut and step budget and the tail context of `--tail-context` in place "
    "of the config's (the cut slots kept in every later step's input as committed EOS; 0: none, the paper's cut; "
    "'all': every step at full length, answers closer to full length's)",
    "ort-oracle": "ONNX Runtime told each answer's true length (from ort-full) before it starts: every step, the "
    "first included, runs on prompt + that length; the limit no detector can beat",
    **{f"ort-{q}-seer": f"ort-seer on the export quantized to {q} (`export --quantize {q}`: weight-only, blocks of "
       "32, MatMulNBits; the embedding keeps fp32), with the same Seer config: the cut read from the quantized "
       "graph's own step-zero statistics" for q in ("int8", "int4")},
    **{f"ort-{q}-seer-fast": f"ort-seer-fast on the export quantized to {q}" for q in ("int8", "int4")},
    "torch-seer": "the same runtime loop with Seer on torch eager (`TorchBackend`): Seer without the exported graphs",
    "trt-full": "the runtime loop on a TensorRT engine at full gen_length",
    "trt-seer": "the runtime loop on a TensorRT engine with Seer (kept lengths rounded up to the engine's buckets)",
}


@dataclass
class BatchOutput:
    """What one row produced for one batch of requests and what it cost."""

    tokens: np.ndarray  # int64 [B, gen_length]; cut tails hold EOS
    forward_passes: int
    tokens_processed: int  # real (non-padding) tokens through the model
    kept: list[int] | None  # per request: response slots the later steps ran on (Seer and the oracle)
    step_zero_seconds: float = 0.0  # of the call's time, spent in step zero
    first_step_seconds: float | None = None  # service rows: the engine's load + this call up to step zero's end


Runner = Callable[[Sequence[Prompt], Sequence[int]], BatchOutput]  # (requests, their indices) -> output


def reference_row(torch_service: Service, config: GenerationConfig) -> Runner:
    """LLaDA's loop in torch eager on the checkpoint's model (its pictures, if any, encoded by the checkpoint's own
    vision tower through the service)."""

    def run(requests: Sequence[Prompt], indices: Sequence[int]) -> BatchOutput:
        prompts = torch_service.prompt_ids(requests, config)
        model = torch_service.backend.model  # type: ignore[attr-defined]  # a checkpoint's backend is torch
        out = generate(model, prompts, config, generator=torch.Generator().manual_seed(0))
        return BatchOutput(out.tokens.numpy().astype(np.int64), out.passes, out.tokens_processed, None)

    return run


def service_row(service: Service, config: GenerationConfig, seer: SeerConfig | None) -> Runner:
    """The generation service on its target, at full length (seer None) or with Seer."""

    def run(requests: Sequence[Prompt], indices: Sequence[int]) -> BatchOutput:
        out = service.generate(requests, full_length=seer is None, seer=seer, generation=config)
        kept = [a.seer.kept for a in out.answers if a.seer is not None] if seer is not None else None
        tokens = np.array([a.tokens for a in out.answers], dtype=np.int64)
        return BatchOutput(tokens, out.passes, out.tokens_processed, kept, out.step_zero_seconds,
                           out.first_step_seconds)

    return run


def oracle_plan(gen_length: int, steps: int, block_length: int | None, true_length: int) -> TruncationPlan:
    """The plan of a request whose length is known before it starts: the blocks and step budget Seer would give a
    cut at `true_length`, with no step zero at full length, so all of them run on prompt + true length.

    The executor treats blocks[0].steps as including a step zero that has already run; the extra step here is
    that slot, so every one of the budget's passes runs short (`step_slots` skips exactly one).
    """
    blocks = block_plan(gen_length, steps, block_length, true_length)
    first = blocks[0]
    shifted = (BlockPlan(first.start, first.end, first.steps + 1), *blocks[1:])
    return TruncationPlan(gen_length=gen_length, kept=true_length, blocks=shifted, full_steps=steps)


def oracle_row(service: Service, config: GenerationConfig, true_lengths: Sequence[int]) -> Runner:
    """Every request on prompt + its true length from the first step on (`true_lengths` indexed like the bench's
    request list), rows grouped by the batch scheduler as after a Seer cut; at temperature 0 each row's tokens are
    those of a run with gen_length = its true length."""
    G, info = config.gen_length, service.info

    def run(requests: Sequence[Prompt], indices: Sequence[int]) -> BatchOutput:
        lengths = [min(G, max(1, int(true_lengths[i]))) for i in indices]
        plans = [oracle_plan(G, config.steps, config.block_length, n) for n in lengths]
        out = run_planned(service.backend, service.prompt_ids(requests, config), config, plans, ids=SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id))
        return BatchOutput(out.tokens, out.passes, out.tokens_processed, lengths)

    return run
