"""Device buffers an engine reads and writes at fixed addresses, whatever the shape of a call."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from seer_deploy.core.errors import ConfigError


class IOBuffers:
    """One device buffer per engine input and output, allocated once at its largest shape; calls get views of them.

    A view of shape s is the first prod(s) elements of the flat buffer: the dense, row-major layout TensorRT reads
    and writes at a tensor's address, so the address is the same for every call whatever its shape.
    """

    def __init__(self, capacity: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype],
                 device: torch.device) -> None:
        self.capacity = dict(capacity)
        self._flat = {name: torch.empty(max(math.prod(shape), 1), dtype=dtypes[name], device=device)
                      for name, shape in capacity.items()}

    def address(self, name: str) -> int:
        return int(self._flat[name].data_ptr())

    def view(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """The buffer of `name` as a tensor of `shape`; ConfigError past its capacity."""
        limit = self.capacity[name]
        if len(shape) != len(limit) or any(d < 0 or d > m for d, m in zip(shape, limit, strict=True)):
            raise ConfigError(f"{name} of shape {tuple(shape)} exceeds the engine's largest profile {limit}; "
                              "check --max-batch/--max-prompt of the build")
        return self._flat[name][: math.prod(shape)].view(tuple(shape))
