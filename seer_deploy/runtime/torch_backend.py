"""The torch eager model behind the `Backend` interface: the reference that the exported backends are compared with.

It returns what the exported graphs return (the chosen token, its log-probability, EOS probability and the
sparsity rows), computed the way `reference.generate` computes them, so the runtime loop over this backend gives
the reference loop's tokens.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import Tensor

from seer_deploy.core.backend import PromptInput, RefreshOutput, Step0Output, StepInput, StepOutput, WindowInput
from seer_deploy.core.decoding import Scoring
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.sparsity import SparsityRow, StatsSpec
from seer_deploy.models.checkpoints.dimple import LoadedDimple
from seer_deploy.models.checkpoints.multimodal import LoadedMultimodal
from seer_deploy.models.networks.confidence import greedy_head, token_log_prob
from seer_deploy.models.networks.image_prompts import ImageConditionedModel
from seer_deploy.models.networks.llada import MaskPredictor, ModelOutput
from seer_deploy.models.pictures.mrope import text_position_shift
from seer_deploy.models.prompts.image_placeholders import image_table_np
from seer_deploy.runtime.reference import gumbel_argmax
from seer_deploy.runtime.reference_logits import guided_logits, prefix_width
from seer_deploy.runtime.reference_rules import pick_scored


class TorchBackend:
    """Runs a MaskPredictor in eager mode; step zero reports the MLP statistics of `stats` (default: all layers).

    It is the one backend with the full logits in hand, so it also runs classifier-free guidance
    (`StepInput.guidance`), as the reference loop does: a second pass with the prompt masked.
    """

    name = "torch"
    supports_guidance = True
    supports_cache = True
    supports_prompt_cache = True

    def __init__(self, model: MaskPredictor, stats: StatsSpec | None = None, *, device_cache: bool | None = None
                 ) -> None:
        cfg = model.cfg
        self.stats = stats if stats is not None else StatsSpec(layers=tuple(range(cfg.n_layers)))
        bad = [layer for layer in self.stats.layers if not 0 <= layer < cfg.n_layers]
        if bad or len(set(self.stats.layers)) != len(self.stats.layers):
            raise ConfigError(
                f"stats layers {list(self.stats.layers)} must be distinct layers of the model's {cfg.n_layers} "
                f"(0..{cfg.n_layers - 1})"
            )
        self.model = model.eval()
        self.max_seq_len = cfg.max_seq_len
        self.eos_id = cfg.eos_id
        self.mask_id = cfg.mask_id
        self.sparsity_rows: list[SparsityRow] = self.stats.sparsity_rows
        self._device = next(model.parameters()).device
        # The KV cache as a tensor on the model's device (it never crosses to the host); None: on a GPU, not on a CPU.
        self.device_cache = self._device.type != "cpu" if device_cache is None else device_cache
        self.window_lead = model.window_lead

    def _forward(self, inputs: StepInput, stats: StatsSpec | None) -> tuple[Tensor, Tensor | None]:
        """Logits (guided when inputs.guidance > 0) and, with `stats`, the statistics of the conditional pass."""
        checked = inputs.checked(self.max_seq_len)
        ids = torch.from_numpy(checked.input_ids).to(self._device)
        assert checked.attention_mask is not None  # checked() always gives one
        mask = None if bool(checked.attention_mask.all()) else torch.from_numpy(checked.attention_mask).to(self._device)
        is_prompt = torch.zeros_like(ids, dtype=torch.bool)
        is_prompt[:, : checked.prompt_width] = True
        if mask is not None:
            is_prompt &= mask.bool()
        return guided_logits(self.model, ids, mask, is_prompt, checked.guidance, self.mask_id, stats,
                             checked.prompt_width)

    @torch.inference_mode()
    def step0(self, inputs: StepInput) -> Step0Output:
        """Greedy step zero at full length, with EOS probability and the sparsity rows [B, L*F, S] (layer-major)."""
        logits, stats = self._forward(inputs, self.stats)
        return self._step0_output(logits, stats, inputs.scoring)

    def _step0_output(self, logits: Tensor, stats: Tensor | None, scoring: Scoring | None) -> Step0Output:
        token, confidence, top, log_total = greedy_head(logits)
        eos_prob = torch.exp(logits[..., self.eos_id].float() - top - log_total)
        assert stats is not None  # requested with self.stats
        B, L, Fn, S = stats.shape
        score = None if scoring is None else _pick(logits, 0.0, None, scoring).score
        return Step0Output(
            token_ids=_numpy(token, np.int64),
            confidence=_numpy(confidence, np.float32),
            eos_prob=_numpy(eos_prob, np.float32),
            sparsity=_numpy(stats.reshape(B, L * Fn, S), np.float32),
            score=score,
        )

    @torch.inference_mode()
    def step(self, inputs: StepInput) -> StepOutput:
        """x0 (argmax, or LLaDA's Gumbel-max sample seeded by `seed` at temperature > 0) and log softmax(logits)[x0]."""
        logits, _ = self._forward(inputs, None)
        return _pick(logits, inputs.temperature, inputs.seed, inputs.scoring)

    @torch.inference_mode()
    def refresh(self, inputs: StepInput) -> RefreshOutput:
        """A step that also returns every layer's keys and values (the KV caches; no guidance)."""
        out, checked = self._pass_with_kv(inputs, None)
        picked = _pick(out.logits, checked.temperature, checked.seed, checked.scoring)
        return RefreshOutput(picked.token_ids, picked.confidence, self._cache(out.kv), picked.score)

    @torch.inference_mode()
    def prefill(self, inputs: StepInput) -> Step0Output:
        """Step zero (greedy, with the statistics) that also returns every layer's keys and values: the prompt cache."""
        out, _ = self._pass_with_kv(inputs, self.stats)
        return self._step0_output(out.logits, out.stats, inputs.scoring)._replace(kv=self._cache(out.kv))

    def _pass_with_kv(self, inputs: StepInput, stats: StatsSpec | None) -> tuple[ModelOutput, StepInput]:
        checked = inputs.checked(self.max_seq_len)
        if checked.guidance > 0:
            raise ConfigError("the KV caches do not run classifier-free guidance; set cfg_scale to 0 or drop the cache")
        assert checked.attention_mask is not None
        ids = torch.from_numpy(checked.input_ids).to(self._device)
        out = self.model(ids, torch.from_numpy(checked.attention_mask).to(self._device), stats=stats, return_kv=True,
                         **prefix_width(self.model, ids.shape[0], checked.prompt_width, self._device))
        return out, checked

    @torch.inference_mode()
    def window_step(self, inputs: WindowInput) -> StepOutput:
        """A step over the window's columns only, against a refresh's keys and values."""
        checked = inputs.checked()
        device = self._device
        logits = self.model.forward_window(
            torch.from_numpy(checked.window_ids).to(device), torch.from_numpy(checked.attention_mask).to(device),
            torch.from_numpy(checked.window_start).to(device), _tensor(checked.kv, device),
            self._width(checked.window_ids.shape[0], checked.prompt_width), self._shift(checked.position_shift),
        )
        return _pick(logits, checked.temperature, checked.seed)

    @torch.inference_mode()
    def prompt_step(self, inputs: PromptInput) -> StepOutput:
        """A pass over the run's columns against the prompt cache (every run column is computed, whatever the
        candidates say)."""
        checked = inputs.checked()
        device = self._device
        ids = torch.from_numpy(checked.run_ids).to(device)
        kv = _tensor(checked.prompt_kv, device)
        start = torch.full((ids.shape[0],), kv.shape[4], dtype=torch.long, device=device)
        hidden = self.model.cached_hidden(ids, torch.from_numpy(checked.attention_mask).to(device), start, kv,
                                          self._width(ids.shape[0], checked.prompt_width),
                                          self._shift(checked.position_shift))
        logits = self.model.shifted(self.model.logits_of(hidden), dim=1)
        return _pick(logits, checked.temperature, checked.seed, checked.scoring)

    def _width(self, batch: int, prompt_width: int) -> Tensor | None:
        return prefix_width(self.model, batch, prompt_width, self._device).get("prompt_width")

    def _shift(self, shift: np.ndarray | None) -> Tensor | None:
        """A cached pass's position shift (WindowInput.position_shift) on the model's device."""
        return None if shift is None else torch.from_numpy(shift).to(self._device)

    def _cache(self, kv: Tensor | None) -> np.ndarray | Tensor:
        assert kv is not None, "a pass with return_kv returns the keys and values"
        return kv.float() if self.device_cache else _numpy(kv, np.float32)


def _pick(logits: Tensor, temperature: float | np.ndarray, seed: int | None, scoring: Scoring | None = None
          ) -> StepOutput:
    """x0 (argmax, or LLaDA's Gumbel-max sample seeded by `seed` at temperature > 0) and log softmax(logits)[x0];
    with `scoring` (the Dream family's rules) x0 comes from the tempered, filtered logits and the rule's score is
    returned too (models.networks.rule_scores)."""
    temperatures = np.unique(np.asarray(temperature, dtype=np.float64))
    if temperatures.size != 1:
        raise ConfigError("the torch backend samples every row of a step at one temperature; give one number")
    value = float(temperatures[0])
    generator = None
    if value > 0:
        generator = torch.Generator(device=logits.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
    if scoring is None:
        token = gumbel_argmax(logits, value, generator)
        return StepOutput(token_ids=_numpy(token, np.int64), confidence=_numpy(token_log_prob(logits, token), np.float32))
    token, score = pick_scored(logits, value, generator, scoring)
    return StepOutput(_numpy(token, np.int64), _numpy(token_log_prob(logits, token), np.float32),
                      _numpy(score, np.float32))


def _tensor(kv: np.ndarray | Tensor, device: torch.device) -> Tensor:
    """A KV cache on `device`: a host array is copied there, a device tensor is used as it is."""
    return kv.to(device) if isinstance(kv, Tensor) else torch.from_numpy(kv).to(device)


def _numpy(t: Tensor, dtype: type[np.generic]) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=dtype)


class MultimodalTorchBackend(TorchBackend):
    """A TorchBackend over a LLaDA-V-style checkpoint: `encode_images` runs the vision tower and projector,
    `set_image_table` hands the language model the embeddings that the prompts' image ids point at."""

    def __init__(self, loaded: LoadedMultimodal, stats: StatsSpec | None = None) -> None:
        super().__init__(loaded.lm.model, stats)
        self.language_model = loaded.lm.model
        self.vision = loaded.vision.eval()
        self.width = loaded.config.d_model

    @torch.inference_mode()
    def encode_images(self, pixel_values: np.ndarray) -> np.ndarray:
        """float32 [N, 3, H, W] -> float32 [N, tokens_per_image, D] (N = 0 gives an empty array)."""
        if len(pixel_values) == 0:
            return np.zeros((0, self.vision.cfg.tokens_per_image, self.width), dtype=np.float32)
        pixels = torch.from_numpy(np.ascontiguousarray(pixel_values, np.float32)).to(self._device)
        return _numpy(self.vision(pixels), np.float32)

    def set_image_table(self, table: np.ndarray | list[np.ndarray]) -> None:
        """The batch's image embeddings (one row per image token, in id order); an empty list = no images."""
        rows = image_table_np(table if isinstance(table, list) else [table], self.width)
        self.model = ImageConditionedModel(self.language_model, torch.from_numpy(rows).to(self._device)).eval()


class DimpleTorchBackend(TorchBackend):
    """A TorchBackend over a Dimple checkpoint: `encode_patches` runs the Qwen2.5-VL tower and the projector on a
    batch's pictures, `set_image_table` hands the language model their embeddings and M-RoPE layout."""

    def __init__(self, loaded: LoadedDimple, stats: StatsSpec | None = None) -> None:
        super().__init__(ImageConditionedModel(loaded.lm.model, torch.zeros(1, loaded.config.d_model)), stats)
        self.language_model = loaded.lm.model
        self.vision = loaded.vision.eval()
        self.width = loaded.config.d_model

    @torch.inference_mode()
    def encode_patches(self, tower_inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The vision graph's inputs (models.pictures.qwen_layout.tower_inputs) -> float32 [image tokens, D]."""
        feed = {name: torch.from_numpy(np.ascontiguousarray(value)).to(self._device)
                for name, value in tower_inputs.items()}
        return _numpy(self.vision(**feed), np.float32)

    def set_image_table(self, table: np.ndarray | list[np.ndarray], layout: np.ndarray | None = None) -> None:
        """The batch's image embeddings (one row per image token, in id order) and their places in the pictures."""
        rows = image_table_np(table if isinstance(table, list) else [table], self.width)
        self.model = ImageConditionedModel(self.language_model, torch.from_numpy(rows).to(self._device),
                                           layout).eval()

    def position_shift(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The cached passes' position shift of these rows (core.backend.position_shift)."""
        model = cast(ImageConditionedModel, self.model)
        return text_position_shift(input_ids, attention_mask, model.embed.num_embeddings, model.image_layout)
