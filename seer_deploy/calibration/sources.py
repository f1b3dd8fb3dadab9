"""Where calibration's step zero and full-length answers come from: one interface, two implementations.

A checkpoint is calibrated on its torch model: every layer's statistics, at every threshold pair the fit sweeps, and
the reference loop's answers (`TorchSource`, today's path). An export is calibrated on what it computes itself
(`BackendSource`): step zero through its backend, whose graph reports one (abs, rel) threshold pair for its stats
layers only, and full-length answers through the runtime loop on that backend. So a quantized export gets the margin
its own statistics and answers call for, and the fit says that it could not sweep thresholds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from seer_deploy.calibration.collect import StepZeroSet, Thresholds, batched_generation, in_length_order, step_zero_set
from seer_deploy.core.backend import Backend, StepInput
from seer_deploy.core.generation import GenerationConfig, SpecialIds, left_pad
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.executor import mask_columns
from seer_deploy.runtime.loop import run_generation
from seer_deploy.seer.config import SeerConfig

Progress = Callable[[int, int], None]


class AnswerSource(Protocol):
    """What calibration runs on: step zero over a prompt set, and answers (full length, or with a Seer config)."""

    @property
    def cfg(self) -> ModelConfig: ...

    def step_zero(self, prompts: Sequence[list[int]], gen_length: int, thresholds: Sequence[Thresholds],
                  batch_size: int = 64) -> StepZeroSet: ...

    def answers(self, prompts: Sequence[list[int]], config: GenerationConfig, seer: SeerConfig | None = None,
                batch_size: int = 64, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def statistics(self, thresholds: Sequence[Thresholds]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class TorchSource:
    """A checkpoint's torch model (or an ImageConditionedModel holding a prompt set's pictures)."""

    model: MaskPredictor

    @property
    def cfg(self) -> ModelConfig:
        return self.model.cfg

    def step_zero(self, prompts: Sequence[list[int]], gen_length: int, thresholds: Sequence[Thresholds],
                  batch_size: int = 64) -> StepZeroSet:
        return step_zero_set(self.model, prompts, gen_length, thresholds, batch_size)

    def answers(self, prompts: Sequence[list[int]], config: GenerationConfig, seer: SeerConfig | None = None,
                batch_size: int = 64, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
        return batched_generation(self.model, prompts, config, seer=seer, batch_size=batch_size, progress=progress)

    def statistics(self, thresholds: Sequence[Thresholds]) -> dict[str, Any]:
        return {"from": "torch", "layers": "all", "thresholds": [list(t) for t in thresholds], "swept": True}


@dataclass(frozen=True)
class BackendSource:
    """An opened target's backend (an export on ONNX Runtime, quantized or not): its step zero reports the rows
    `backend.sparsity_rows` at the one threshold pair its graph was exported with."""

    backend: Backend
    cfg: ModelConfig
    thresholds: Thresholds  # the export's own (manifest seer.abs_threshold, seer.rel_threshold)
    mask_id: int
    pad_id: int
    eos_id: int

    def step_zero(self, prompts: Sequence[list[int]], gen_length: int, thresholds: Sequence[Thresholds] = (),
                  batch_size: int = 64) -> StepZeroSet:
        """Step zero on every prompt, left-padded in batches; `thresholds` is ignored (the graph has its own)."""
        rows = tuple(self.backend.sparsity_rows)
        ids_out, eos_out, stats_out = [], [], []
        for lo in range(0, len(prompts), batch_size):
            ids, real = left_pad(list(prompts[lo : lo + batch_size]), self.pad_id)
            B, P = ids.shape
            x = np.concatenate([ids, np.full((B, gen_length), self.mask_id, dtype=np.int64)], axis=1)
            mask = np.concatenate([real, np.ones((B, gen_length), dtype=np.int64)], axis=1)
            out = self.backend.step0(StepInput(x, None if bool(mask.all()) else mask, prompt_width=P,
                                               candidates=mask_columns(x, None, self.mask_id)))
            ids_out.append(out.token_ids[:, P:])
            eos_out.append(out.eos_prob[:, P:])
            stats_out.append(out.sparsity[:, :, P:])
        return StepZeroSet(gen_length, np.concatenate(ids_out).astype(np.int64),
                           np.concatenate(eos_out).astype(np.float32), rows,
                           {self.thresholds: np.concatenate(stats_out).astype(np.float32)})

    def answers(self, prompts: Sequence[list[int]], config: GenerationConfig, seer: SeerConfig | None = None,
                batch_size: int = 64, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The runtime loop on the backend, as a service runs it (greedy; with `seer`, cut after step zero)."""

        def run(batch: list[list[int]]) -> tuple[np.ndarray, list[int] | None]:
            out = run_generation(self.backend, batch, config, ids=SpecialIds(mask=self.mask_id, pad=self.pad_id, eos=self.eos_id), seer=seer)
            return out.tokens, None if out.seer is None else [r.kept for r in out.seer]

        return in_length_order(prompts, config.gen_length, batch_size, run, progress)

    def statistics(self, thresholds: Sequence[Thresholds] = ()) -> dict[str, Any]:
        return {"from": self.backend.name, "layers": sorted({layer for layer, _ in self.backend.sparsity_rows}),
                "thresholds": [list(self.thresholds)], "swept": False,
                "note": "the export's graph computes one threshold pair for its stats layers: no threshold sweep "
                        "(calibrate the checkpoint for that)"}
