"""What Seer reads from step zero: per-position statistics of the MLP hidden h = silu(gate(x)) * up(x).

The model computes them (models.networks.llada), the step-zero graph returns them, Seer (seer/) reads them; this leaf module
is their one description, free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass

# The per-position statistics of the MLP hidden, in this order.
STAT_NAMES: tuple[str, ...] = ("frac_h_abs", "frac_gate_abs", "frac_h_rel", "mean_abs_h")

# One sparsity row of a step-zero output: (transformer layer, statistic name).
SparsityRow = tuple[int, str]


@dataclass(frozen=True)
class StatsSpec:
    """Which layers report MLP statistics, and the thresholds that define 'near zero'."""

    layers: tuple[int, ...]
    abs_threshold: float = 0.05  # |h| below this counts as sparse
    rel_threshold: float = 0.05  # |h| below this share of the position's max |h| counts as sparse

    @property
    def sparsity_rows(self) -> list[SparsityRow]:
        """The rows of the sparsity output, layer-major: row l * len(STAT_NAMES) + f is statistic f of layer l."""
        return layer_major_rows(self.layers)


def layer_major_rows(layers: tuple[int, ...], stat_names: tuple[str, ...] = STAT_NAMES) -> list[SparsityRow]:
    """The sparsity rows of `layers` in the order the graphs and the torch model emit them."""
    return [(layer, stat) for layer in layers for stat in stat_names]
