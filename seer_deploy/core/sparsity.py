"""What Seer reads from step zero: per-position statistics of the MLP hidden h = silu(gate(x)) * up(x).

The model computes them (models.networks.llada), the step-zero graph returns them, Seer (seer/) reads them; this leaf
module is their one description, free of torch: `StatsSpec` is the one type for "which layers, at which thresholds",
used by the export (what the graph computes), its manifest, the Seer config (what a detector reads) and the runtime
(whether an export computes what a config reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

# The per-position statistics of the MLP hidden, in this order.
STAT_NAMES: tuple[str, ...] = ("frac_h_abs", "frac_gate_abs", "frac_h_rel", "mean_abs_h")
DEFAULT_ABS_THRESHOLD = 0.05  # |h| below this counts as sparse
DEFAULT_REL_THRESHOLD = 0.05  # |h| below this share of the position's max |h| counts as sparse

# One sparsity row of a step-zero output: (transformer layer, statistic name).
SparsityRow = tuple[int, str]


class StatsRequest(Protocol):
    """What asks for statistics (a Seer config): its layers as written (see `StatsSpec.resolve`) and thresholds."""

    @property
    def stats_layers(self) -> tuple[int, ...]: ...
    @property
    def abs_threshold(self) -> float: ...
    @property
    def rel_threshold(self) -> float: ...


class StatsError(ValueError):
    """Layer indices that a model does not have (the caller names the flag or file and the fix)."""


@dataclass(frozen=True)
class StatsSpec:
    """Which transformer layers report MLP statistics (resolved: 0..n_layers-1, no repeats) and the thresholds that
    define 'near zero'."""

    layers: tuple[int, ...]
    abs_threshold: float = DEFAULT_ABS_THRESHOLD
    rel_threshold: float = DEFAULT_REL_THRESHOLD

    @classmethod
    def resolve(cls, layers: tuple[int, ...] | None, n_layers: int, abs_threshold: float = DEFAULT_ABS_THRESHOLD,
                rel_threshold: float = DEFAULT_REL_THRESHOLD) -> StatsSpec:
        """The one rule for layer indices as users write them: None = every layer, () = the last layer, a negative
        index counts from the end. StatsError for a layer the model lacks or one named twice."""
        if layers is None:
            resolved: tuple[int, ...] = tuple(range(n_layers))
        else:
            resolved = tuple(i + n_layers if -n_layers <= i < 0 else i for i in layers) or (n_layers - 1,)
        bad = [i for i in resolved if not 0 <= i < n_layers]
        if bad:
            raise StatsError(f"stats_layers {list(layers or ())} name layers that a {n_layers}-layer model lacks; use "
                             f"0..{n_layers - 1} (or -1 for the last)")
        if len(set(resolved)) != len(resolved):
            raise StatsError(f"stats_layers {list(resolved)} lists a layer twice")
        return cls(resolved, abs_threshold, rel_threshold)

    @classmethod
    def from_config(cls, seer: StatsRequest | None, n_layers: int) -> StatsSpec:
        """What step zero computes for `seer` (its layers, () = the last, and thresholds); without a config, every
        layer at the default thresholds, so that any later calibration finds its rows."""
        if seer is None:
            return cls.resolve(None, n_layers)
        return cls.resolve(seer.stats_layers, n_layers, seer.abs_threshold, seer.rel_threshold)

    @property
    def sparsity_rows(self) -> list[SparsityRow]:
        """The rows of the sparsity output, layer-major: row l * len(STAT_NAMES) + f is statistic f of layer l."""
        return layer_major_rows(self.layers)

    def missing_for(self, wanted: StatsSpec) -> str | None:
        """Why statistics computed as `self` cannot serve a reader that wants `wanted` (other thresholds, layers not
        computed), in words; None when they can."""
        if (self.abs_threshold, self.rel_threshold) != (wanted.abs_threshold, wanted.rel_threshold):
            return (f"thresholds abs {wanted.abs_threshold:g} / rel {wanted.rel_threshold:g}, computed at abs "
                    f"{self.abs_threshold:g} / rel {self.rel_threshold:g}")
        absent = sorted(set(wanted.layers) - set(self.layers))
        if absent:
            return f"layers {absent}, computed for layers {list(self.layers)} only"
        return None

    def to_manifest(self) -> dict[str, Any]:
        """The export manifest's `seer` section."""
        return {
            "stats_layers": list(self.layers),
            "stat_names": list(STAT_NAMES),
            "abs_threshold": self.abs_threshold,
            "rel_threshold": self.rel_threshold,
            "sparsity_rows": [[layer, stat] for layer, stat in self.sparsity_rows],
        }


def layer_major_rows(layers: tuple[int, ...], stat_names: tuple[str, ...] = STAT_NAMES) -> list[SparsityRow]:
    """The sparsity rows of `layers` in the order the graphs and the torch model emit them."""
    return [(layer, stat) for layer in layers for stat in stat_names]
