"""The exported graphs as torch modules around `MaskPredictor` (their I/O is declared in contracts.graphs): the sampling
head lives inside the graph.

One step graph serves every full pass, so an engine holds the weights once: step zero (`with_stats` = 1: Seer's
sparsity statistics and the EOS probabilities), every later step, and in a --kv-cache export the cache refresh
(the `kv` output). It does only the work a pass needs:
  * the LM head, its softmax and the sampling run on the `candidates` columns only (the masks the pass may commit),
    gathered from the last hidden states; other columns return their input id, confidence -inf, EOS probability 0;
  * the statistics sit behind a conditional (ONNX If) on `with_stats`, so later steps skip them;
  * the sampling branch sits behind a conditional on any temperature > 0: a greedy pass never builds the softmax
    and cumulative sum over the vocabulary.
A step moves B x S numbers to the host rather than B x S x V logits; the same modules are the torch side of export
validation, so "ORT matches torch" means these.

Sampling at temperature > 0 is inverse-CDF sampling from softmax(logits / T) with one host-drawn uniform number per
position: index = #{v : cumsum(p)[v] < u}. That is an exact draw from the distribution LLaDA's Gumbel-max
`argmax(exp(l) / (-log u)^T)` samples from, needs B x S noise instead of B x S x V, is reproducible from a host
seed, and uses only Softmax / CumSum / Less / ReduceSum, which ONNX Runtime and TensorRT both run.

`window_step` (export --kv-cache) runs a window of columns (a denoising block) against the keys and values a full
pass returned (Fast-dLLM's dual cache, refreshed by the loop at each block's first step); `prompt_step` (also --kv-cache)
runs the last prompt token and the response against the keys and values of the columns before them (the prompt
cache: LaViDa's prefix-DLM cache, exact; Dimple's prefilling elsewhere). Both head their columns as the step graph
does (`candidate_head`; the window graph heads every column of its window).

A prefix-DLM model's step graph (ModelConfig.prefix_dlm, LaViDa) takes `prompt_width` [B] last; a multimodal one
takes the image table before it: prompt ids at and above the LM's embedding rows select a row of it in-graph
(models.networks.image_prompts.embed_with_images). The vision graph folds in the SigLIP tower, the selected layer, the
projector and LLaVA's image_newline, and outputs float32 whatever the export dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from seer_deploy.contracts.graphs import GraphIO, export_graphs
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.networks.confidence import greedy_head, log_prob_of
from seer_deploy.models.networks.image_prompts import embed_with_images
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.models.networks.qwen_vision import DimpleVisionEncoder
from seer_deploy.models.networks.rule_scores import rule_score
from seer_deploy.models.networks.vision import VisionEncoder


def _keep_greedy(logits: Tensor, temperature: Tensor, uniform: Tensor, ids: Tensor, conf: Tensor, top: Tensor,
                 log_total: Tensor) -> tuple[Tensor, Tensor]:
    return ids.clone(), conf.clone()  # a conditional's branch may not return its inputs themselves


def _sample(logits: Tensor, temperature: Tensor, uniform: Tensor, ids: Tensor, conf: Tensor, top: Tensor,
            log_total: Tensor) -> tuple[Tensor, Tensor]:
    """Rows with temperature > 0 draw from softmax(logits / T) (T = 1 stands in for greedy rows, which keep ids)."""
    hot = temperature > 0
    t = torch.where(hot, temperature, torch.ones_like(temperature))[:, None, None]
    cdf = torch.cumsum(torch.softmax(logits / t, dim=-1), dim=-1)
    # float32 rounding can leave cdf[-1] a hair under u: clamp to the last id.
    drawn = torch.clamp((cdf < uniform[..., None]).sum(dim=-1), max=logits.shape[-1] - 1)
    drawn_conf = log_prob_of(logits, drawn, top, log_total)
    row_hot = hot[:, None]
    return torch.where(row_hot, drawn, ids), torch.where(row_hot, drawn_conf, conf)


def pick_tokens(logits: Tensor, temperature: Tensor, sample_uniform: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The head over logits [B, C, V]: token (argmax, or a sample where temperature[b] > 0) and log softmax(logits)
    [token], plus the max logit and log-sum `log_prob_of` needs. sample_uniform [B, C] in (0, 1], ignored where
    temperature[b] == 0; the sampling branch runs only when some row samples."""
    logits = logits.float()
    ids, conf, top, log_total = greedy_head(logits)
    ids, conf = torch.cond((temperature > 0).any(), _sample, _keep_greedy,
                           (logits, temperature, sample_uniform, ids, conf, top, log_total))
    return ids, conf, top, log_total


def _confidence_score(logits: Tensor, ids: Tensor, conf: Tensor, rule: Tensor, temperature: Tensor) -> Tensor:
    return conf.clone()  # every row ranks by log p(token) at temperature 1: the confidence itself


def _rule_score(logits: Tensor, ids: Tensor, conf: Tensor, rule: Tensor, temperature: Tensor) -> Tensor:
    return rule_score(logits, ids, rule, temperature)


def score_head(logits: Tensor, ids: Tensor, conf: Tensor, rule: Tensor, temperature: Tensor) -> Tensor:
    """[B, C]: each row's score_rule over softmax(logits / score_temperature) (models.networks.rule_scores); the
    margin and entropy (a top-2 and a softmax over the vocabulary) run only when some row asks for them."""
    return torch.cond(((rule != 0) | (temperature != 1)).any(), _rule_score, _confidence_score,
                      (logits, ids, conf, rule, temperature))


class StepGraph(nn.Module):
    """Every full pass: (input_ids, attention_mask, temperature, sample_uniform, candidates, with_stats, score_rule,
    score_temperature) -> token_ids, confidence, eos_prob, sparsity [B, K, S] (layer-major), score and, with
    `kv_cache`, kv."""

    def __init__(self, model: MaskPredictor, spec: StatsSpec, kv_cache: bool = False) -> None:
        super().__init__()
        self.model = model
        self.spec = spec
        self.kv_cache = kv_cache

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor,
                candidates: Tensor, with_stats: Tensor, score_rule: Tensor, score_temperature: Tensor
                ) -> tuple[Tensor, ...]:
        return self.outputs(input_ids, None, attention_mask, (temperature, sample_uniform, candidates), with_stats,
                            (score_rule, score_temperature))

    def outputs(self, input_ids: Tensor, embeds: Tensor | None, attention_mask: Tensor,
                sampling: tuple[Tensor, Tensor, Tensor], with_stats: Tensor, scoring: tuple[Tensor, Tensor],
                prompt_width: Tensor | None = None, position_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The graph's outputs; `sampling` = (temperature, sample_uniform, candidates), `scoring` = (score_rule,
        score_temperature), as the graph's inputs of those names."""
        temperature, sample_uniform, candidates = sampling
        model = self.model
        out = model.hidden_states(None if embeds is not None else input_ids, attention_mask, inputs_embeds=embeds,
                                  stats=self.spec, return_kv=self.kv_cache, prompt_width=prompt_width,
                                  stats_wanted=(with_stats > 0).any(), position_ids=position_ids)
        assert out.stats is not None
        B, S, _ = out.hidden.shape
        head = candidate_head(model, out.hidden, input_ids, candidates, temperature, sample_uniform)
        eos_prob = torch.zeros((B, S), device=head.eos.device).scatter(1, candidates, head.eos)
        _, L, F, _ = out.stats.shape
        result = (head.token_ids, head.confidence, eos_prob, out.stats.reshape(B, L * F, S),
                  scattered_score(head, candidates, *scoring))
        return (*result, out.kv) if out.kv is not None else result


class CandidateHead(NamedTuple):
    token_ids: Tensor  # [B, S]: the pick at the candidate columns, the input id elsewhere
    confidence: Tensor  # [B, S]: its log-probability at the candidate columns, -inf elsewhere
    eos: Tensor  # [B, C]: the softmax probability of EOS at each candidate column
    logits: Tensor  # [B, C, V]: the candidates' logits (float32), what a decoding rule's score reads
    picked: Tensor  # [B, C]: the pick at each candidate column
    picked_confidence: Tensor  # [B, C]: its log-probability


def candidate_head(model: MaskPredictor, hidden: Tensor, input_ids: Tensor, candidates: Tensor, temperature: Tensor,
                   sample_uniform: Tensor) -> CandidateHead:
    """The LM head, its softmax and the pick on the candidate columns only (hidden [B, S, D] of the columns input_ids
    [B, S] holds, candidates [B, C] among them; with shift_logits a column's logits come from the column before)."""
    B, S, D = hidden.shape
    C = candidates.shape[1]
    rows = torch.gather(hidden, 1, model.logit_source(candidates)[..., None].expand(B, C, D))
    logits = model.logits_of(rows).float()  # [B, C, V]
    uniform = torch.gather(sample_uniform, 1, candidates)
    ids, conf, top, log_total = pick_tokens(logits, temperature, uniform)
    eos = torch.exp(logits[..., model.cfg.eos_id] - top - log_total)
    token_ids = input_ids.scatter(1, candidates, ids)
    confidence = torch.full((B, S), float("-inf"), device=conf.device).scatter(1, candidates, conf)
    return CandidateHead(token_ids, confidence, eos, logits, ids, conf)


def scattered_score(head: CandidateHead, candidates: Tensor, rule: Tensor, temperature: Tensor) -> Tensor:
    """[B, S]: the decoding rule's score (`score_head`) at the candidate columns, -inf elsewhere."""
    score = score_head(head.logits, head.picked, head.picked_confidence, rule, temperature)
    return torch.full(head.confidence.shape, float("-inf"), device=score.device).scatter(1, candidates, score)


class PrefixStepGraph(StepGraph):
    """StepGraph of a prefix-DLM model (ModelConfig.prefix_dlm): prompt_width [B] last (contracts.graphs.PROMPT_WIDTH)."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, candidates: Tensor, with_stats: Tensor, score_rule: Tensor,
                score_temperature: Tensor, prompt_width: Tensor) -> tuple[Tensor, ...]:
        return self.outputs(input_ids, None, attention_mask, (temperature, sample_uniform, candidates), with_stats,
                            (score_rule, score_temperature), prompt_width)


class MultimodalStepGraph(StepGraph):
    """StepGraph with image ids: the image table after with_stats."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, candidates: Tensor, with_stats: Tensor, score_rule: Tensor,
                score_temperature: Tensor, image_table: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(self.model.embed, input_ids, image_table)
        return self.outputs(input_ids, embeds, attention_mask, (temperature, sample_uniform, candidates), with_stats,
                            (score_rule, score_temperature))


class MultimodalPrefixStepGraph(StepGraph):
    """MultimodalStepGraph of a prefix-DLM model (LaViDa): prompt_width [B] after the image table."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, candidates: Tensor, with_stats: Tensor, score_rule: Tensor,
                score_temperature: Tensor, image_table: Tensor, prompt_width: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(self.model.embed, input_ids, image_table)
        return self.outputs(input_ids, embeds, attention_mask, (temperature, sample_uniform, candidates), with_stats,
                            (score_rule, score_temperature), prompt_width)


class PositionsStepGraph(StepGraph):
    """MultimodalStepGraph of an M-RoPE model (Dimple): position_ids [3, B, S] after the image table."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, candidates: Tensor, with_stats: Tensor, score_rule: Tensor,
                score_temperature: Tensor, image_table: Tensor, position_ids: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(self.model.embed, input_ids, image_table)
        return self.outputs(input_ids, embeds, attention_mask, (temperature, sample_uniform, candidates), with_stats,
                            (score_rule, score_temperature), position_ids=position_ids)


def step_module(model: MaskPredictor, spec: StatsSpec, *, multimodal: bool = False, kv_cache: bool = False
                ) -> StepGraph:
    """The step module an export traces, declared by contracts.graphs.step_graph with the same switches (prefix-DLM and
    M-RoPE positions from the model's config; positions only with pictures)."""
    if multimodal and model.cfg.mrope_section is not None:
        if model.cfg.prefix_dlm:
            raise ConfigError("an M-RoPE model (Dimple) with prefix-DLM attention is not exported; set "
                              "\"prefix_lm\": false in config.json")
        return PositionsStepGraph(model, spec, kv_cache)
    variants = {(False, False): StepGraph, (False, True): PrefixStepGraph,
                (True, False): MultimodalStepGraph, (True, True): MultimodalPrefixStepGraph}
    return variants[multimodal, model.cfg.prefix_dlm](model, spec, kv_cache)


class WindowStepGraph(nn.Module):
    """A cached step: only the window's columns run (`MaskPredictor.forward_window`), the rest comes from kv."""

    def __init__(self, model: MaskPredictor) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, window_ids: Tensor, attention_mask: Tensor, window_start: Tensor, kv: Tensor, temperature: Tensor,
        sample_uniform: Tensor,
    ) -> tuple[Tensor, Tensor]:
        return self.outputs(window_ids, attention_mask, window_start, kv, temperature, sample_uniform)

    def outputs(self, window_ids: Tensor, attention_mask: Tensor, window_start: Tensor, kv: Tensor,
                temperature: Tensor, sample_uniform: Tensor, prompt_width: Tensor | None = None,
                position_shift: Tensor | None = None) -> tuple[Tensor, Tensor]:
        logits = self.model.forward_window(window_ids, attention_mask, window_start, kv, prompt_width, position_shift)
        ids, conf, _, _ = pick_tokens(logits, temperature, sample_uniform)
        return ids, conf


class PrefixWindowStepGraph(WindowStepGraph):
    """WindowStepGraph of a prefix-DLM model: prompt_width [B] last (a window starting one column before its block,
    shifted logits, may hold the last prompt column, which sees no response key)."""

    def forward(self, window_ids: Tensor, attention_mask: Tensor, window_start: Tensor,  # type: ignore[override]
                kv: Tensor, temperature: Tensor, sample_uniform: Tensor, prompt_width: Tensor
                ) -> tuple[Tensor, Tensor]:
        return self.outputs(window_ids, attention_mask, window_start, kv, temperature, sample_uniform, prompt_width)


class PositionsWindowStepGraph(WindowStepGraph):
    """WindowStepGraph of an M-RoPE model (Dimple): position_shift [B] last (its window columns are text after the
    row's pictures)."""

    def forward(self, window_ids: Tensor, attention_mask: Tensor, window_start: Tensor,  # type: ignore[override]
                kv: Tensor, temperature: Tensor, sample_uniform: Tensor, position_shift: Tensor
                ) -> tuple[Tensor, Tensor]:
        return self.outputs(window_ids, attention_mask, window_start, kv, temperature, sample_uniform,
                            position_shift=position_shift)


def window_module(model: MaskPredictor, positions: bool = False) -> WindowStepGraph:
    """The window module an export traces (contracts.graphs.window_graph; prefix-DLM from the model's config,
    `positions` for an M-RoPE model with pictures)."""
    if positions:
        return PositionsWindowStepGraph(model)
    return PrefixWindowStepGraph(model) if model.cfg.prefix_dlm else WindowStepGraph(model)


class PromptStepGraph(nn.Module):
    """A pass against the prompt cache: the last prompt token and the response run, against the keys and values of
    the columns before them (prompt_kv, cut from step zero's), positions continuing from the cache. prompt_width [B]
    (where the responses start) is read by a prefix-DLM model only: its last prompt column sees no response key,
    which makes the cache exact."""

    def __init__(self, model: MaskPredictor) -> None:
        super().__init__()
        self.model = model

    def forward(self, run_ids: Tensor, attention_mask: Tensor, prompt_kv: Tensor, temperature: Tensor,
                sample_uniform: Tensor, candidates: Tensor, score_rule: Tensor, score_temperature: Tensor,
                prompt_width: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.outputs(run_ids, attention_mask, prompt_kv, (temperature, sample_uniform, candidates),
                            (score_rule, score_temperature), prompt_width)

    def outputs(self, run_ids: Tensor, attention_mask: Tensor, prompt_kv: Tensor, sampling: tuple[Tensor, ...],
                scoring: tuple[Tensor, Tensor], prompt_width: Tensor, position_shift: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor]:
        temperature, sample_uniform, candidates = sampling
        B = run_ids.shape[0]
        run_start = torch.full((B,), prompt_kv.shape[4], dtype=torch.long, device=run_ids.device)
        width = prompt_width if self.model.cfg.prefix_dlm else None
        hidden = self.model.cached_hidden(run_ids, attention_mask, run_start, prompt_kv, width, position_shift)
        head = candidate_head(self.model, hidden, run_ids, candidates, temperature, sample_uniform)
        return head.token_ids, head.confidence, scattered_score(head, candidates, *scoring)


class PositionsPromptStepGraph(PromptStepGraph):
    """PromptStepGraph of an M-RoPE model (Dimple): position_shift [B] last (its run columns are text after the row's
    pictures)."""

    def forward(self, run_ids: Tensor, attention_mask: Tensor, prompt_kv: Tensor,  # type: ignore[override]
                temperature: Tensor, sample_uniform: Tensor, candidates: Tensor, score_rule: Tensor,
                score_temperature: Tensor, prompt_width: Tensor, position_shift: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        return self.outputs(run_ids, attention_mask, prompt_kv, (temperature, sample_uniform, candidates),
                            (score_rule, score_temperature), prompt_width, position_shift)


class DimpleVisionGraph(nn.Module):
    """Dimple's tower and projector on host-prepared inputs (contracts.graphs.QWEN_VISION) -> image_embeds
    [image_tokens, D] (float32)."""

    def __init__(self, vision: DimpleVisionEncoder) -> None:
        super().__init__()
        self.vision = vision

    def forward(self, pixel_patches: Tensor, rotary_cos: Tensor, rotary_sin: Tensor, window_segments: Tensor,
                picture_segments: Tensor, restore_order: Tensor) -> Tensor:
        return self.vision(pixel_patches, rotary_cos, rotary_sin, window_segments, picture_segments,
                           restore_order).float()


class VisionGraph(nn.Module):
    """pixel_values [N, 3, H, W] (float32) -> image_embeds [N, tokens_per_image, D] (float32)."""

    def __init__(self, vision: VisionEncoder) -> None:
        super().__init__()
        self.vision = vision

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.vision(pixel_values).float()


def cache_modules(model: MaskPredictor, positions: bool = False) -> tuple[tuple[GraphIO, nn.Module], ...]:
    """The cache graphs of a --kv-cache export (after the step graph) and the modules traced for them (`positions`:
    an M-RoPE model's, with pictures)."""
    _, window, prompt = export_graphs(prefix_dlm=model.cfg.prefix_dlm, kv_cache=True, positions=positions)
    prompt_module = PositionsPromptStepGraph(model) if positions else PromptStepGraph(model)
    return (window, window_module(model, positions)), (prompt, prompt_module)
