"""How the server runs: limits, batching, auth. Checked before the model loads, so a bad flag is one line, not a
traceback from a half-started server."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TextIO

from seer_deploy.core.errors import ConfigError

LOOPBACK_NAMES = ("localhost",)
BATCHING = ("step", "call")  # serve --batching: step-level (serve/stepper.py) or per call (serve/batcher.py)


@dataclass(frozen=True)
class ServeOptions:
    """Server settings. The generation defaults (gen_length, steps, decoding, Seer) are the Service's own options;
    these are what HTTP adds on top."""

    model_name: str = "seer-demo"  # the id /v1/models lists and responses carry
    batching: str = "step"  # "step": rows join and leave between passes; "call": rows of one kind, one call each
    max_batch: int = 32  # live rows (step), or rows in one Service.generate call (call)
    max_wait_ms: float = 5.0  # per call: how long the first queued row waits for others to fill its batch
    max_queue: int = 256  # rows waiting (not running); beyond it new requests get 429
    timeout_s: float = 60.0  # per-request deadline, queueing included; past it 504
    max_body_bytes: int = 8 << 20  # request bodies above this get 413 (a data-URL picture is most of it)
    read_timeout_s: float = 30.0  # a request's headers, then its body, must arrive within this (408, or closed)
    max_connections: int = 512  # open connections; beyond it a request gets 503 and its connection is closed
    max_prompts: int = 32  # prompts in one /v1/completions request (each is one row)
    gen_lengths: tuple[int, ...] = ()  # sizes max_tokens rounds up to; () = powers of two from 16 that fit
    api_key: str | None = None  # bearer token for /v1/* and /metrics; None = no auth
    retry_after_s: int = 1  # the Retry-After a 429 carries
    replica: str | None = None  # a Ray Serve replica's id: sent as x-seer-replica and in /metrics
    access_log: TextIO | None = field(default=None, compare=False)  # one JSON line per request, or none

    def check(self) -> None:
        """ConfigError naming the flag, before anything loads."""
        for name, value, low in (("--max-batch", self.max_batch, 1), ("--max-queue", self.max_queue, 1),
                                 ("--max-body-bytes", self.max_body_bytes, 1024), ("--max-prompts", self.max_prompts, 1),
                                 ("--retry-after", self.retry_after_s, 0), ("--max-connections", self.max_connections, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} is {value!r}; it must be an integer >= {low}")
        if self.batching not in BATCHING:
            raise ConfigError(f"--batching is {self.batching!r}; use one of {', '.join(BATCHING)}")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ConfigError(f"--max-wait-ms is {self.max_wait_ms!r}; it must be from 0 to 10000")
        if not 0 < self.timeout_s <= 86_400:
            raise ConfigError(f"--timeout is {self.timeout_s!r}; it must be a number of seconds above 0 (at most a day)")
        if not 0 < self.read_timeout_s <= 3600:
            raise ConfigError(f"--read-timeout is {self.read_timeout_s!r}; it must be a number of seconds above 0 (at "
                              "most an hour)")
        if any(not isinstance(g, int) or g < 1 for g in self.gen_lengths):
            raise ConfigError(f"--gen-lengths {','.join(map(str, self.gen_lengths))} must be positive integers, "
                              "e.g. 32,64,128")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key is empty; give a token, or leave it unset for no authentication")


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine (the default: nothing else can reach it)."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
