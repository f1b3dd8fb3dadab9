"""The modes `seer-deploy eval` compares, named in one place: each is a set of options users already have.

A mode is what `generate` would run with some flags: Seer on or off, `--decode threshold`, `--kv-cache`,
`--tail-context`, `--first-canvas`. `full` (Seer off, the fixed schedule) is the baseline every other mode is
compared with, so it always runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.seer.config import SeerConfig, TailContext

BASELINE = "full"


@dataclass(frozen=True)
class Mode:
    name: str
    flags: str  # the `generate` flags this mode stands for, as the table's legend shows them
    seer: bool = False  # Seer on (the target's calibrated config, else --seer-config, else the built-in defaults)
    threshold: bool = False  # --decode threshold (Fast-dLLM's parallel decoding) over --fast-block-length blocks
    kv_cache: bool = False  # --kv-cache (Fast-dLLM's dual KV cache; an export needs it exported)
    tail: bool = False  # Seer with --tail-context
    progressive: bool = False  # Seer with --first-canvas (progressive step zero)


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode(BASELINE, "--no-seer"),
    Mode("seer", "--seer", seer=True),
    Mode("seer-fast", "--seer --decode threshold --kv-cache", seer=True, threshold=True, kv_cache=True),
    Mode("fast", "--no-seer --decode threshold --kv-cache", threshold=True, kv_cache=True),
    Mode("threshold", "--no-seer --decode threshold", threshold=True),
    Mode("seer-tail", "--seer --tail-context N", seer=True, tail=True),
    Mode("seer-progressive", "--seer --first-canvas N", seer=True, progressive=True),
)}


@dataclass(frozen=True)
class ModeSettings:
    """The values behind the modes' flags (the eval command's options)."""

    threshold: float = 0.9  # --threshold of the threshold modes (Fast-dLLM's default)
    fast_block_length: int = 32  # their denoising block (Fast-dLLM's), or one block where it does not divide
    tail_context: TailContext = "all"  # seer-tail's --tail-context
    first_canvas: int = 32  # seer-progressive's --first-canvas


def parse_modes(text: str) -> tuple[Mode, ...]:
    """'full,seer,seer-fast' ('all': every mode) -> the modes, the baseline first (added when not named);
    ConfigError naming an unknown one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        names = list(MODES)
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ConfigError(f"--modes: unknown mode '{unknown[0]}'; choose from {', '.join(MODES)}")
    ordered = dict.fromkeys([BASELINE, *names])
    return tuple(MODES[n] for n in ordered)


def mode_generation(mode: Mode, base: GenerationConfig, settings: ModeSettings) -> GenerationConfig:
    """The generation settings of `mode` on top of the user's (--gen-length, --steps, --block-length, ...)."""
    config = base
    if mode.threshold:
        block = settings.fast_block_length if base.gen_length % settings.fast_block_length == 0 else None
        config = replace(config, decode="threshold", threshold=settings.threshold, block_length=block)
    if mode.kv_cache:
        config = replace(config, kv_cache=True)
    return config  # checked when made


def mode_seer(mode: Mode, seer: SeerConfig | None, gen_length: int, settings: ModeSettings) -> SeerConfig | None:
    """The Seer config `mode` runs with; None at full length."""
    if not mode.seer:
        return None
    if seer is None:
        raise ConfigError(f"mode '{mode.name}' needs a Seer config; give --seer-config FILE or calibrate the target")
    if mode.tail:
        seer = seer.with_(tail_context=settings.tail_context)
    if mode.progressive:
        seer = seer.with_(first_canvas=min(settings.first_canvas, gen_length))
    return seer
