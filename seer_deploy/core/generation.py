"""How a response is denoised, shared by every loop: the settings, LLaDA's block / step split and left padding.

The response is `gen_length` masks split into denoising blocks of `block_length`; `steps` are split evenly across
the blocks; inside a block its masked positions are committed over its steps by an even split, the remainder to
the first steps (`runtime.loopcore.transfer_schedule`, the one schedule every loop uses). Prompts of different lengths are left-padded so that every response starts at
the same column.

Parallel decoding (`decode`, Fast-dLLM's rules) replaces the fixed split: a step commits the longest run of the
ranked candidates (most confident first) whose r-th confidence clears the rule's r-th threshold, at least one;
a block ends when it has no masks left, so the step count follows the model's confidence (`rank_thresholds`). A pass
that changes none of the candidates (the model proposed the mask token itself) also ends its block, which would
otherwise repeat that pass for ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from seer_deploy.core import decoding_names
from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.decoding import SCORE_RULES, Scoring, check_rule
from seer_deploy.core.decoding_names import DREAM_DECODES
from seer_deploy.core.errors import ConfigError

Remasking = Literal["low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"]
REMASKING_CHOICES: tuple[Remasking, ...] = decoding_names.REMASKING_CHOICES  # type: ignore[assignment]
Decode = Literal["fixed", "threshold", "factor", "timesteps", "confident"]
DECODE_CHOICES: tuple[Decode, ...] = decoding_names.DECODE_CHOICES  # type: ignore[assignment]
MAX_FACTOR = 1e6
MAX_GEN_LENGTH = 1 << 20  # response slots, steps and block length: far above any model's positions
MAX_SCALE = 1e6  # temperature and cfg_scale: finite, and far beyond where either still changes an answer


def steps_per_block(gen_length: int, steps: int, block_length: int | None) -> tuple[int, int]:
    """(block length, steps per block) under LLaDA's even split; ConfigError if the split is not even."""
    block = block_length or gen_length
    if block < 1 or gen_length % block:
        raise ConfigError(
            f"gen_length {gen_length} is not a multiple of block_length {block}; "
            f"choose a block_length that divides gen_length"
        )
    n_blocks = gen_length // block
    if steps < 1 or steps % n_blocks:
        raise ConfigError(f"steps {steps} cannot be split evenly across {n_blocks} blocks; use a multiple of {n_blocks}")
    return block, steps // n_blocks


@dataclass(frozen=True)
class SpecialIds:
    """The ids a denoising loop needs: the mask it fills, what left padding holds and what a cut tail holds (EOS;
    `pad` unless given)."""

    mask: int
    pad: int
    eos: int = -1  # -1: the pad id

    def __post_init__(self) -> None:
        if self.eos == -1:
            object.__setattr__(self, "eos", self.pad)
        if self.pad == self.mask:
            raise ConfigError(f"pad_id equals mask_id ({self.mask}): padding would be denoised; pad with EOS instead")


@dataclass(frozen=True)
class GenerationConfig:
    """How a response is denoised. Checked when it is made (`validate`), so holding one is the proof that its
    settings are sound; `check_fits` is the one check of a batch of prompts against a model's positions."""

    gen_length: int = 128
    steps: int = 128
    block_length: int | None = None  # None: one block of gen_length
    temperature: float = 0.0
    remasking: Remasking = "low_confidence"
    cfg_scale: float = 0.0  # classifier-free guidance (torch backends only: it needs the full logits)
    # fixed: LLaDA's even split; threshold / factor: Fast-dLLM's parallel decoding; timesteps / confident: the Dream
    # family's sampler (Dream's diffusion_generate, Dimple's confident decoding; core.decoding)
    decode: Decode = "fixed"
    # decode="threshold": commit every candidate whose probability is >= threshold; decode="confident": every mask
    # whose score is > threshold (Dimple's alg_p_threshold)
    threshold: float = 0.9
    factor: float = 1.0  # decode="factor": commit the top n while the n-th probability is >= 1 - factor / (n + 1)
    kv_cache: bool = False  # block-wise dual KV cache: refresh at each block's first step, then run the block only
    # the prompt cache: step zero's keys and values of the columns before the last prompt token, kept; every later
    # pass runs the last prompt token and the response only (exact under prefix-DLM attention: LaViDa)
    prompt_cache: bool = False
    eps: float = 1e-3  # the Dream family's sampler: timesteps linspace(1, eps, steps + 1)
    alg_temp: float = 0.0  # > 0: draw the committed positions from softmax(score / alg_temp) (Dream's alg_temp)
    top_p: float | None = None  # the Dream family's sampler: nucleus filter before the softmax (torch only)
    top_k: int | None = None  # the Dream family's sampler: top-k filter before the softmax (torch only)
    # LaViDa-Dream: step zero is the prompt pass, which commits the first answer token greedily (and nothing else);
    # the sampler's `steps` passes follow over the other masks
    first_from_prompt: bool = False
    # No rule was named: the service replaces decode / remasking (and what goes with them) with the family's own once
    # the target is open (models.families.families.authors_rule, service.with_authors_rule)
    family_rule: bool = False

    def __post_init__(self) -> None:
        self.validate()

    @property
    def parallel(self) -> bool:
        """Whether steps commit by Fast-dLLM's confidence rule (their number then follows the model) instead of a
        schedule."""
        return self.decode in ("threshold", "factor")

    @property
    def dream_sampler(self) -> bool:
        """Whether the Dream family's sampler runs (core.decoding): one block, the counts from its timesteps."""
        return self.decode in DREAM_DECODES

    @property
    def passes_follow_model(self) -> bool:
        """Whether a row's passes are known only when it is done (parallel decoding, the Dream family's sampler,
        which skips passes that commit nothing and stops when no mask is left, the KV cache)."""
        return self.parallel or self.dream_sampler or self.kv_cache

    def scoring(self) -> Scoring | None:
        """What the head scores candidates by under the Dream family's sampler (None: LLaDA's rules, whose score is
        the confidence). Dimple's confident decoding reads the untouched softmax (`use_original_confidence`), Dream's
        the one it samples from."""
        if not self.dream_sampler:
            return None
        rule = SCORE_RULES[self.remasking]
        if self.decode == "confident":
            return Scoring(rule, 1.0, self.top_p, self.top_k, original=True)
        return Scoring(rule, self.temperature if self.temperature > 0 else 1.0, self.top_p, self.top_k)

    @property
    def block(self) -> int:
        return self.block_length or self.gen_length

    @property
    def n_blocks(self) -> int:
        return self.gen_length // self.block

    @property
    def steps_per_block(self) -> int:
        return steps_per_block(self.gen_length, self.steps, self.block_length)[1]

    def validate(self) -> None:
        """Raise ConfigError naming the bad setting (and its flag) and a fix; every value is checked for its type,
        finiteness and range before anything runs: `--temperature nan` or `--block-length 0` never mean a default."""
        for name in ("gen_length", "steps"):
            value = getattr(self, name)
            if not int_in(value, 1, MAX_GEN_LENGTH):
                raise ConfigError(
                    f"{name} is {value!r}; it must be an integer from 1 to {MAX_GEN_LENGTH} ({_flag(name)})"
                )
        if self.block_length is not None and not int_in(self.block_length, 1, MAX_GEN_LENGTH):
            raise ConfigError(
                f"block_length is {self.block_length!r}; it must be an integer from 1 to {MAX_GEN_LENGTH}, or unset "
                "for one block of gen_length (--block-length)"
            )
        steps_per_block(self.gen_length, self.steps, self.block_length)
        if self.remasking not in REMASKING_CHOICES:
            raise ConfigError(f"remasking {self.remasking!r} is unknown; use one of {', '.join(REMASKING_CHOICES)} "
                              "(--remasking)")
        for name in ("temperature", "cfg_scale"):
            value = getattr(self, name)
            if not number_in(value, 0.0, MAX_SCALE):
                raise ConfigError(
                    f"{name} is {value!r}; it must be a finite number from 0 to {MAX_SCALE:g} ({_flag(name)})"
                )
        if self.decode not in DECODE_CHOICES:
            raise ConfigError(f"decode {self.decode!r} is unknown; use one of {', '.join(DECODE_CHOICES)} (--decode)")
        if not number_in(self.threshold, 0.0, 1.0) or self.threshold == 0:
            raise ConfigError(f"threshold is {self.threshold!r}; it must be a probability in (0, 1] (--threshold)")
        if not number_in(self.factor, 0.0, MAX_FACTOR) or self.factor == 0:
            raise ConfigError(f"factor is {self.factor!r}; it must be a number in (0, {MAX_FACTOR:g}] (--factor)")
        check_rule(self.decode, self.remasking, self.eps, self.alg_temp, self.top_p, self.top_k, self.block_length,
                   self.gen_length)
        if self.first_from_prompt is not False and not (self.first_from_prompt is True and self.dream_sampler):
            raise ConfigError("first_from_prompt (LaViDa-Dream's greedy first token) is true or false, and only with "
                              "--decode timesteps or confident")
        if self.dream_sampler and self.kv_cache:  # one block: the block-wise cache would hold the prompt only
            raise ConfigError(f"--decode {self.decode} (the Dream family's sampler) runs one block over the whole "
                              "answer, where the block-wise cache holds the prompt only: that is --prompt-cache "
                              "(Dimple's prefilling); use it instead of --kv-cache")
        if self.dream_sampler and self.cfg_scale > 0:
            raise ConfigError(f"--decode {self.decode} (the Dream family's sampler) runs without --cfg-scale; drop it")
        if self.parallel and self.remasking != "low_confidence":
            raise ConfigError(
                f"--decode {self.decode} ranks candidates by the model's confidence; it cannot use --remasking "
                f"{self.remasking}: use --remasking low_confidence or --decode fixed"
            )
        if not isinstance(self.kv_cache, bool):
            raise ConfigError(f"kv_cache is {self.kv_cache!r}; it must be true or false (--kv-cache)")
        if not isinstance(self.prompt_cache, bool):
            raise ConfigError(f"prompt_cache is {self.prompt_cache!r}; it must be true or false (--prompt-cache)")
        if self.kv_cache and self.prompt_cache:
            raise ConfigError("--kv-cache (the block-wise cache) and --prompt-cache are two caches of the same keys and "
                              "values; choose one")
        for flag, on in (("--kv-cache", self.kv_cache), ("--prompt-cache", self.prompt_cache)):
            if on and self.cfg_scale > 0:
                raise ConfigError(f"{flag} does not run classifier-free guidance (it would need a second cache); set "
                                  f"--cfg-scale 0 or drop {flag}")

    def check_fits(self, max_seq_len: int, prompt_len: int, image_tokens: bool = False) -> None:
        """ConfigError unless the longest prompt (`prompt_len`) and gen_length fit in the model's positions."""
        if prompt_len + self.gen_length > max_seq_len:
            raise ConfigError(
                f"prompt ({prompt_len} tokens{', image tokens included' if image_tokens else ''}) + gen_length "
                f"({self.gen_length}) = {prompt_len + self.gen_length} "
                f"exceeds the model's {max_seq_len} positions; shorten the prompt or lower --gen-length"
            )


    def rank_thresholds(self, n: int) -> np.ndarray:
        """float32 [n]: the log-probability the r-th ranked candidate (0 = most confident) must reach to be committed
        under the parallel rule; rank 0 is -inf (a step commits at least one). Every loop (torch reference, C core,
        numpy twin) compares the float32 log-probability confidence with these very numbers, so they agree exactly.
        """
        if not self.parallel:
            raise ConfigError("rank_thresholds is for --decode threshold or factor; fixed decoding uses a schedule")
        with np.errstate(divide="ignore"):
            if self.decode == "threshold":
                probability = np.full(n, self.threshold, dtype=np.float64)
            else:  # factor: Fast-dLLM's rule, n tokens when (n + 1) * (1 - p_n) < factor
                probability = 1.0 - self.factor / (np.arange(n, dtype=np.float64) + 2.0)
            logs = np.log(np.clip(probability, 0.0, 1.0)).astype(np.float32)
        if n:
            logs[0] = -np.inf
        return logs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ids int64 [B, width] and attention mask int64 [B, width] (1 = real token); width defaults to the
    longest prompt."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt must have at least one token")
    longest = max(len(p) for p in prompts)
    width = longest if width is None else width
    if width < longest:
        raise ConfigError(f"left_pad width {width} is shorter than the longest prompt ({longest} tokens)")
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return ids, mask
