"""Seer's run options (`--seer/--no-seer`, `--seer-config`, `--tail-context`, `--first-canvas`): which config a run
uses and what it overrides, as one value the service, the server and the command line share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seer_deploy.core.errors import ConfigError
from seer_deploy.seer.config import SeerConfig, TailContext


@dataclass(frozen=True)
class SeerOptions:
    """Seer for a run. None keeps what the target says (its calibrated config, that config's settings)."""

    on: bool | None = None  # None: on when a calibrated Seer config is found
    config: Path | SeerConfig | None = None  # instead of the target's own: a file from `calibrate`, or a config
    tail_context: TailContext | None = None  # overrides the config's
    first_canvas: int | None = None  # overrides the config's (progressive step zero; 0: off)

    def check(self, gen_length: int) -> None:
        """ConfigError for overrides that contradict --no-seer or do not fit `gen_length`, before anything loads."""
        if self.tail_context is not None and self.on is False:
            raise ConfigError("--tail-context applies to Seer runs; drop --no-seer or --tail-context")
        if self.first_canvas is not None and self.on is False:
            raise ConfigError("--first-canvas applies to Seer runs; drop --no-seer or --first-canvas")
        if self.first_canvas is not None and not 0 <= self.first_canvas <= gen_length:
            raise ConfigError(f"--first-canvas {self.first_canvas} must be from 0 (off) to --gen-length "
                              f"({gen_length})")

    def applied(self, seer: SeerConfig) -> SeerConfig:
        """`seer` with this run's overrides on top."""
        if self.tail_context is not None:
            seer = seer.with_(tail_context=self.tail_context)
        return seer if self.first_canvas is None else seer.with_(first_canvas=self.first_canvas)
