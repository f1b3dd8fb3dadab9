"""The backends a target can run on, by name (`--backend`): torch eager, ONNX Runtime, TensorRT. Kept apart from
`core.backend` (numpy) so that the command line's option groups name them without loading a library."""

from __future__ import annotations

from typing import Literal

BackendChoice = Literal["torch", "ort", "tensorrt"]
BACKEND_CHOICES: tuple[BackendChoice, ...] = ("torch", "ort", "tensorrt")
