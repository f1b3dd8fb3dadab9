"""Seer's settings: which detector, its floors, the safety margin, the statistics it reads, calibrated vectors.

One small JSON file (`SeerConfig.save` / `SeerConfig.load`) carries a calibration to `generate`, `export` (which reads
the keys `stats_layers`, `abs_threshold`, `rel_threshold` to build the step-zero graph) and the runtime loops.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from seer_deploy.core.atomic import write_text_atomic
from seer_deploy.core.checks import ascii_int, int_in, number_in
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.files import read_json
from seer_deploy.core.sparsity import STAT_NAMES, SparsityRow, StatsError, StatsSpec

Detector = Literal["sparsity", "eos", "fused"]
Score = Literal["t", "snr"]
TailContext = int | Literal["all"]
DETECTORS: tuple[str, ...] = ("sparsity", "eos", "fused")
CONFIG_VERSION = 1
MAX_SLOTS = 1 << 20  # response slots: far above any gen_length a model supports
MAX_LAYER = 1 << 10
CHECKPOINT_CONFIG_NAME = "seer.json"  # a calibration stored inside a checkpoint directory


def _short(value: float) -> float:
    """Seven significant digits: keeps the JSON small and round trips to within float32 precision."""
    return float(f"{value:.7g}")


@dataclass(frozen=True)
class Trend:
    """The positional trend of each pooled sparsity row at one gen_length, estimated at calibration.

    mean[r][p] is row r's expected value at response position p with the answer/padding step removed; scale[r] is
    the spread left around it. Subtracting it is what keeps a smooth drift along the position from passing for a step.
    """

    gen_length: int
    mean: tuple[tuple[float, ...], ...]  # [R][gen_length]
    scale: tuple[float, ...]  # [R]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gen_length": self.gen_length,
            "mean": [[_short(v) for v in r] for r in self.mean],
            "scale": [_short(v) for v in self.scale],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Trend:
        return cls(
            gen_length=int(raw["gen_length"]),
            mean=tuple(tuple(float(v) for v in row) for row in raw["mean"]),
            scale=tuple(float(v) for v in raw["scale"]),
        )


@dataclass(frozen=True)
class SeerConfig:
    """How Seer finds the end of the answer at step zero and how much it keeps.

    detector: 'eos' (first step-zero EOS after which EOS keeps winning), 'sparsity' (SNR step in the pooled MLP
    sparsity profile) or 'fused' (both; never cuts before either confident boundary).
    kept length = boundary + margin, rounded up to the smallest of `buckets` that fits, never above gen_length.
    tail_context: how many of the cut slots the later steps still see, as committed EOS that is never decoded: 0
    (the paper's cut: later steps run on prompt + kept length only), a count, or 'all' (the whole tail: the steps
    are still the cut's, but every step runs at full length; on the demo the answers then equal full length's).
    `calibrate --target-identical` chooses it, after the margin (calibration.identity_fit.fit_identity_margin).
    first_canvas: progressive step zero (`runtime.loop`): step zero first runs on prompt + this many masks; a row whose
    kept length falls inside that canvas is planned from it, the others run step zero again at full gen_length.
    """

    detector: Detector = "eos"
    margin: int = 4
    floor: float = 5.0  # sparsity: the split score below which there is no clear boundary (no truncation)
    eos_floor: float = 0.5  # eos: the EOS probability at the first tail position below which there is no cut (> 1: never)
    eos_tolerance: int = 0  # eos: stray non-EOS predictions allowed inside the tail
    stats_layers: tuple[int, ...] = ()  # layers whose MLP statistics step zero reports; () = the last layer
    abs_threshold: float = 0.05
    rel_threshold: float = 0.05
    rows: tuple[SparsityRow, ...] = ()  # the sparsity rows the sparsity detector pools; () = all reported
    weights: tuple[float, ...] = ()  # per pooled row: sign and size of its calibrated step; () = two-sided, equal
    score: Score = "t"  # 't': size-weighted SNR (likelihood ratio); 'snr': the plain mean difference / pooled spread
    trend_term: bool = True  # also fit a linear positional drift inside each response when scoring a split
    min_tail: int = 2  # the sparsity detector never places a boundary fewer than this many positions from the end
    trends: tuple[Trend, ...] = ()
    buckets: tuple[int, ...] = ()  # allowed kept lengths (response slots), ascending; () = any length
    tail_context: TailContext = 0  # cut slots kept in the later steps' input as committed EOS; 'all' = every one
    # Progressive step zero: run step zero on a canvas of this many response slots first, and at full gen_length
    # only for the rows whose end it does not find inside (0: step zero at full gen_length, the paper's).
    first_canvas: int = 0
    calibration: dict[str, Any] = field(default_factory=dict, compare=False)  # provenance and measured rates

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the bad setting and a fix."""
        if self.detector not in DETECTORS:
            raise ConfigError(f"seer detector '{self.detector}' is unknown; use one of {', '.join(DETECTORS)}")
        for name, lo in (("margin", 0), ("eos_tolerance", 0), ("min_tail", 1), ("first_canvas", 0)):
            value = getattr(self, name)
            if not int_in(value, lo, MAX_SLOTS):
                raise ConfigError(f"seer {name} is {value!r}; it must be a whole number of response slots from {lo} "
                                  f"to {MAX_SLOTS}")
        for name, low, high in (("floor", 0.0, 1e6), ("eos_floor", 0.0, 1e6)):  # an eos_floor above 1: never cut
            number = getattr(self, name)
            if not number_in(number, low, high):
                raise ConfigError(f"seer {name} is {number!r}; it must be a finite number from {low:g} to {high:g}")
        if self.score not in ("t", "snr"):
            raise ConfigError(f"seer score '{self.score}' is unknown; use 't' or 'snr'")
        if not (number_in(self.abs_threshold, 0.0, 1e6, above_lo=True)
                and number_in(self.rel_threshold, 0.0, 1.0, above_lo=True) and self.rel_threshold < 1):
            raise ConfigError("seer abs_threshold must be a finite number > 0 and rel_threshold one in (0, 1)")
        if not all(int_in(layer, -MAX_LAYER, MAX_LAYER) for layer in self.stats_layers):
            raise ConfigError(f"seer stats_layers {list(self.stats_layers)} must be layer indices (whole numbers; "
                              "negative ones count from the last layer)")
        if not all(number_in(w, -1e6, 1e6) for w in self.weights):
            raise ConfigError(f"seer weights {list(self.weights)} must be finite numbers")
        if not all(int_in(b, 1, MAX_SLOTS) for b in self.buckets):
            raise ConfigError(f"seer buckets {list(self.buckets)} must be whole numbers of response slots >= 1")
        for layer, stat in self.rows:
            if not int_in(layer, 0, MAX_LAYER):
                raise ConfigError(f"seer row ({layer!r}, {stat!r}) names no layer; a row is [layer index, statistic]")
            if stat not in STAT_NAMES:
                raise ConfigError(f"seer row ({layer}, '{stat}') names an unknown statistic; use one of {STAT_NAMES}")
            if self.stats_layers and min(self.stats_layers) >= 0 and layer not in self.stats_layers:
                raise ConfigError(f"seer row ({layer}, '{stat}') reads layer {layer}, which is not in stats_layers")
        if self.weights and len(self.weights) != len(self.rows):
            raise ConfigError(f"seer weights has {len(self.weights)} entries for {len(self.rows)} rows; give one per row")
        for trend in self.trends:
            if len(trend.mean) != len(self.rows) or len(trend.scale) != len(self.rows):
                raise ConfigError(f"seer trend for gen_length {trend.gen_length} does not have one row per pooled row")
            if any(len(r) != trend.gen_length for r in trend.mean) or any(s <= 0 for s in trend.scale):
                raise ConfigError(f"seer trend for gen_length {trend.gen_length} is malformed; recalibrate")
        if list(self.buckets) != sorted(set(self.buckets)) or any(b < 1 for b in self.buckets):
            raise ConfigError(f"seer buckets {list(self.buckets)} must be positive and strictly ascending")
        check_tail_context(self.tail_context)

    def context_slots(self, kept: int, gen_length: int) -> int:
        """The committed EOS slots after a cut at `kept` that the later steps still run (see tail_context): how many
        of the gen_length - kept cut slots it keeps in view."""
        cut = gen_length - kept
        return cut if self.tail_context == "all" else min(int(self.tail_context), cut)

    # -- what step zero has to report ------------------------------------------------------------------------
    def stats_spec(self, n_layers: int) -> StatsSpec:
        """The statistics this config reads from a model of n_layers (`StatsSpec.resolve`'s rule: () = the last
        layer, negative indices from the end); ConfigError for layers the model lacks or rows outside them."""
        try:
            spec = StatsSpec.from_config(self, n_layers)
        except StatsError as exc:
            raise ConfigError(f"seer {exc}; recalibrate for this model (seer-deploy calibrate)") from exc
        outside = [(layer, stat) for layer, stat in self.rows if layer not in spec.layers]
        if outside:
            raise ConfigError(f"seer rows {outside} read layers outside stats_layers {list(spec.layers)}; add them "
                              "to stats_layers or recalibrate")
        return spec

    @property
    def needs_sparsity(self) -> bool:
        return self.detector in ("sparsity", "fused")

    def trend_for(self, gen_length: int) -> Trend | None:
        """The calibrated trend for this gen_length, or the one calibrated at the nearest length."""
        if not self.trends:
            return None
        return min(self.trends, key=lambda t: (abs(t.gen_length - gen_length), -t.gen_length))

    def with_(self, **changes: Any) -> SeerConfig:
        return replace(self, **changes)

    # -- files ------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["version"] = CONFIG_VERSION
        raw["stats_layers"] = list(self.stats_layers)
        raw["rows"] = [[layer, stat] for layer, stat in self.rows]
        raw["weights"] = list(self.weights)
        raw["trends"] = [t.to_dict() for t in self.trends]
        raw["buckets"] = list(self.buckets)
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "seer config") -> SeerConfig:
        version = raw.get("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise ConfigError(f"{source} has version {version}; this seer-deploy reads version {CONFIG_VERSION}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known - {"version"})
        if unknown:
            raise ConfigError(f"{source} has unknown keys {unknown}; remove them or upgrade seer-deploy")
        try:
            kwargs: dict[str, Any] = {k: v for k, v in raw.items() if k in known}
            for key in ("stats_layers", "weights", "buckets"):  # JSON arrays; their values are checked by validate
                if key in kwargs:
                    kwargs[key] = tuple(kwargs[key])
            if "rows" in kwargs:
                kwargs["rows"] = tuple((layer, stat) for layer, stat in kwargs["rows"])
            if "trends" in kwargs:
                kwargs["trends"] = tuple(Trend.from_dict(t) for t in kwargs["trends"])
            if "tail_context" in kwargs:
                kwargs["tail_context"] = parse_tail_context(kwargs["tail_context"])
            return cls(**kwargs)
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"{source} is malformed ({exc}); recalibrate with `seer-deploy calibrate`") from exc

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the config as JSON through a temp file renamed into place."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def shipped_in(cls, checkpoint_dir: Path) -> SeerConfig | None:
        """The calibration a checkpoint directory ships (`seer.json` inside it), or None."""
        file = checkpoint_dir / CHECKPOINT_CONFIG_NAME
        return cls.load(file) if file.is_file() else None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SeerConfig:
        raw = read_json(path, "seer config", fix="write one with `seer-deploy calibrate`")
        return cls.from_dict(raw, source=f"seer config {path}")



def check_tail_context(value: object) -> None:
    """ConfigError unless `value` is a tail_context: an int >= 0 or 'all'."""
    if value == "all":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"seer tail_context {value!r} is not a count of slots >= 0 or 'all'; use 0 (the paper's "
                          f"cut), a count, or 'all' (the whole cut tail as committed EOS)")


def parse_tail_context(value: object) -> TailContext:
    """'all' or a count, from a JSON value or a command-line string ('all', '32'); ConfigError otherwise."""
    if isinstance(value, str):
        text = value.strip().lower()
        number = ascii_int(text)
        value = text if number is None else number
    check_tail_context(value)
    return "all" if value == "all" else int(value)  # type: ignore[call-overload]

