"""The exported graphs as torch modules around `MaskPredictor` (their I/O is declared in spec.graphs): the sampling
head lives inside the graph.

A step moves B x S numbers to the host rather than B x S x V logits, so argmax, the log-probability of the
chosen token (the commit score, `models.confidence`), the EOS probability and Seer's sparsity statistics are
computed here, in forward (no hooks: torch.export rejects them). The same modules are the torch side of export
validation, so "ORT matches torch" means these.

Sampling at temperature > 0 (step graph only) is inverse-CDF sampling from softmax(logits / T) with one host-drawn
uniform number per position: index = #{v : cumsum(p)[v] < u}. That is an exact draw from the distribution LLaDA's
Gumbel-max `argmax(exp(l) / (-log u)^T)` samples from, needs B x S noise instead of B x S x V, is reproducible from a
host seed, and uses only Softmax / CumSum / Less / ReduceSum, which ONNX Runtime and TensorRT both run.

The cache graphs (export --kv-cache): `refresh` is the step graph that also returns every layer's keys and values,
`window_step` runs a window of columns (a denoising block) against them (Fast-dLLM's dual cache, refreshed by the
loop at each block's first step).

A prefix-DLM model's step graphs (ModelConfig.prefix_dlm, LaViDa: `Prefix*Graph`) take `prompt_width` [B] last: the
column where each row's response starts (spec.graphs.PROMPT_WIDTH). The multimodal graphs' embedding adapter passes
prompt_width through, for multimodal prefix variants.

The multimodal step graphs take one more input, the image table: prompt ids at and above the LM's embedding rows
select a row of it in-graph (models.image_prompts.embed_with_images). The vision graph folds in the SigLIP tower, the
selected layer, the projector and LLaVA's image_newline, and outputs float32 whatever the export dtype.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.models.confidence import greedy_head, log_prob_of
from seer_deploy.models.image_prompts import embed_with_images
from seer_deploy.models.llada import MaskPredictor, ModelOutput
from seer_deploy.models.vision import VisionEncoder


class Step0Graph(nn.Module):
    """Step zero: token, confidence, EOS probability per position and the sparsity rows [B, K, S] (layer-major)."""

    def __init__(self, model: MaskPredictor, spec: StatsSpec) -> None:
        super().__init__()
        self.model = model
        self.spec = spec
        self.eos_id = model.cfg.eos_id

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.outputs(input_ids, attention_mask, None)

    def outputs(self, input_ids: Tensor, attention_mask: Tensor,
                prompt_width: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        out = self.model(input_ids, attention_mask, stats=self.spec, prompt_width=prompt_width)
        assert out.stats is not None
        token_ids, confidence, top, log_total = greedy_head(out.logits)
        eos_prob = torch.exp(out.logits[..., self.eos_id].float() - top - log_total)
        B, L, F, S = out.stats.shape
        return token_ids, confidence, eos_prob, out.stats.reshape(B, L * F, S)


def pick_tokens(logits: Tensor, temperature: Tensor, sample_uniform: Tensor) -> tuple[Tensor, Tensor]:
    """The step graphs' head: token (argmax, or a sample where temperature[b] > 0) and log softmax(logits)[token].

    temperature [B] float32; sample_uniform [B, S] float32 in (0, 1], ignored where temperature[b] == 0.
    """
    logits = logits.float()
    greedy_ids, greedy_conf, top, log_total = greedy_head(logits)
    hot = temperature > 0
    # softmax(l / T) for the rows that sample; T = 1 stands in for greedy rows so nothing divides by zero.
    t = torch.where(hot, temperature, torch.ones_like(temperature))[:, None, None]
    cdf = torch.cumsum(torch.softmax(logits / t, dim=-1), dim=-1)
    drawn = (cdf < sample_uniform[..., None]).sum(dim=-1)
    # float32 rounding can leave cdf[-1] a hair under u: clamp to the last id.
    drawn = torch.clamp(drawn, max=logits.shape[-1] - 1)
    drawn_conf = log_prob_of(logits, drawn, top, log_total)
    row_hot = hot[:, None]
    return torch.where(row_hot, drawn, greedy_ids), torch.where(row_hot, drawn_conf, greedy_conf)


class StepGraph(nn.Module):
    """A denoising step: `pick_tokens` over the whole sequence."""

    def __init__(self, model: MaskPredictor) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor
    ) -> tuple[Tensor, Tensor]:
        return self.outputs(input_ids, attention_mask, temperature, sample_uniform, None)

    def outputs(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor,
                prompt_width: Tensor | None) -> tuple[Tensor, Tensor]:
        logits = self.model(input_ids, attention_mask, prompt_width=prompt_width).logits
        return pick_tokens(logits, temperature, sample_uniform)


class RefreshGraph(nn.Module):
    """A step that also returns every layer's keys and values (kv [L, 2, B, H_kv, S, D], float32): the cache."""

    def __init__(self, model: MaskPredictor) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        return self.outputs(input_ids, attention_mask, temperature, sample_uniform, None)

    def outputs(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor,
                prompt_width: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        out = self.model(input_ids, attention_mask, return_kv=True, prompt_width=prompt_width)
        assert out.kv is not None
        return (*pick_tokens(out.logits, temperature, sample_uniform), out.kv)


class WindowStepGraph(nn.Module):
    """A cached step: only the window's columns run (`MaskPredictor.forward_window`), the rest comes from kv."""

    def __init__(self, model: MaskPredictor) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, window_ids: Tensor, attention_mask: Tensor, window_start: Tensor, kv: Tensor, temperature: Tensor,
        sample_uniform: Tensor,
    ) -> tuple[Tensor, Tensor]:
        logits = self.model.forward_window(window_ids, attention_mask, window_start, kv)
        return pick_tokens(logits, temperature, sample_uniform)


class PrefixStep0Graph(Step0Graph):
    """Step0Graph of a prefix-DLM model (ModelConfig.prefix_dlm): prompt_width [B] last (spec.graphs.PROMPT_WIDTH)."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor,  # type: ignore[override]
                prompt_width: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.outputs(input_ids, attention_mask, prompt_width)


class PrefixStepGraph(StepGraph):
    """StepGraph of a prefix-DLM model: prompt_width [B] last."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, prompt_width: Tensor) -> tuple[Tensor, Tensor]:
        return self.outputs(input_ids, attention_mask, temperature, sample_uniform, prompt_width)


class PrefixRefreshGraph(RefreshGraph):
    """RefreshGraph of a prefix-DLM model: prompt_width [B] last (the prompt's keys and values ignore the response)."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, prompt_width: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.outputs(input_ids, attention_mask, temperature, sample_uniform, prompt_width)


def step_modules(model: MaskPredictor, spec: StatsSpec) -> tuple[nn.Module, nn.Module, nn.Module]:
    """The step0, step and refresh modules of a text export: the prefix-DLM variants for a prefix-DLM model."""
    if model.cfg.prefix_dlm:
        return PrefixStep0Graph(model, spec), PrefixStepGraph(model), PrefixRefreshGraph(model)
    return Step0Graph(model, spec), StepGraph(model), RefreshGraph(model)


class _EmbedsModel(nn.Module):
    """Step0Graph / StepGraph call model(ids, mask, stats=...); this adapter receives embeddings in the ids' place."""

    def __init__(self, lm: MaskPredictor) -> None:
        super().__init__()
        self.lm = lm
        self.cfg = lm.cfg

    def forward(self, embeds: Tensor, attention_mask: Tensor | None = None, *, stats: StatsSpec | None = None,
                return_kv: bool = False, prompt_width: Tensor | None = None) -> ModelOutput:
        return self.lm(None, attention_mask, inputs_embeds=embeds, stats=stats,  # type: ignore[no-any-return]
                       return_kv=return_kv, prompt_width=prompt_width)


class MultimodalStep0Graph(nn.Module):
    """Step0Graph with image ids: (input_ids, attention_mask, image_table) -> token, confidence, EOS prob, sparsity."""

    def __init__(self, lm: MaskPredictor, spec: StatsSpec) -> None:
        super().__init__()
        self.head = Step0Graph(cast(MaskPredictor, _EmbedsModel(lm)), spec)  # registers the LM once, inside

    def forward(self, input_ids: Tensor, attention_mask: Tensor, image_table: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head(embeds, attention_mask)  # type: ignore[no-any-return]


class MultimodalStepGraph(nn.Module):
    """StepGraph with image ids: (input_ids, attention_mask, temperature, sample_uniform, image_table)."""

    def __init__(self, lm: MaskPredictor) -> None:
        super().__init__()
        self.head = StepGraph(cast(MaskPredictor, _EmbedsModel(lm)))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor, image_table: Tensor
    ) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head(embeds, attention_mask, temperature, sample_uniform)  # type: ignore[no-any-return]


class MultimodalRefreshGraph(nn.Module):
    """RefreshGraph with image ids: (input_ids, attention_mask, temperature, sample_uniform, image_table)."""

    def __init__(self, lm: MaskPredictor) -> None:
        super().__init__()
        self.head = RefreshGraph(cast(MaskPredictor, _EmbedsModel(lm)))

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor, sample_uniform: Tensor, image_table: Tensor
    ) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head(embeds, attention_mask, temperature, sample_uniform)  # type: ignore[no-any-return]


class MultimodalPrefixStep0Graph(MultimodalStep0Graph):
    """MultimodalStep0Graph of a prefix-DLM model (LaViDa): prompt_width [B] after the image table."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, image_table: Tensor,  # type: ignore[override]
                prompt_width: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head.outputs(embeds, attention_mask, prompt_width)


class MultimodalPrefixStepGraph(MultimodalStepGraph):
    """MultimodalStepGraph of a prefix-DLM model: prompt_width [B] after the image table."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, image_table: Tensor, prompt_width: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head.outputs(embeds, attention_mask, temperature, sample_uniform, prompt_width)


class MultimodalPrefixRefreshGraph(MultimodalRefreshGraph):
    """MultimodalRefreshGraph of a prefix-DLM model: prompt_width [B] after the image table."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor, temperature: Tensor,  # type: ignore[override]
                sample_uniform: Tensor, image_table: Tensor, prompt_width: Tensor) -> tuple[Tensor, ...]:
        embeds = embed_with_images(cast(_EmbedsModel, self.head.model).lm.embed, input_ids, image_table)
        return self.head.outputs(embeds, attention_mask, temperature, sample_uniform, prompt_width)


def multimodal_step_modules(lm: MaskPredictor, spec: StatsSpec) -> tuple[nn.Module, nn.Module, nn.Module]:
    """The step0, step and refresh modules of a multimodal export (declared by spec.graphs.step_graphs /
    cache_graphs(multimodal=True, prefix_dlm=lm.cfg.prefix_dlm)): the prefix-DLM variants for a prefix-DLM LM."""
    if lm.cfg.prefix_dlm:
        return MultimodalPrefixStep0Graph(lm, spec), MultimodalPrefixStepGraph(lm), MultimodalPrefixRefreshGraph(lm)
    return MultimodalStep0Graph(lm, spec), MultimodalStepGraph(lm), MultimodalRefreshGraph(lm)


class VisionGraph(nn.Module):
    """pixel_values [N, 3, H, W] (float32) -> image_embeds [N, tokens_per_image, D] (float32)."""

    def __init__(self, vision: VisionEncoder) -> None:
        super().__init__()
        self.vision = vision

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.vision(pixel_values).float()
