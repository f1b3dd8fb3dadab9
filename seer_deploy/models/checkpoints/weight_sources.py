"""A checkpoint's weights one tensor at a time: where each lies in its shard, read on demand with plain file reads.

A streamed export (seer_deploy.export.streamed_weights) writes its weights file and computes its torch reference
from these, so at no point does the process hold the whole model: only the tensor being converted (or the transformer
layer being run). Reads are `readinto` a fresh buffer rather than a memory map: a map's touched pages count as the
process's resident memory until it is closed, and a shard is gigabytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from seer_deploy.core.errors import CheckpointError
from seer_deploy.core.files import safetensors_header
from seer_deploy.models.checkpoints.checkpoint import CheckpointWeights, finite_weight
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor

# safetensors dtype names -> torch dtypes (the floating types checkpoints ship; integers have no place in the LM)
CHUNK = 1 << 24  # elements converted and checked at a time
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
}


@dataclass(frozen=True)
class WeightSource:
    """One checkpoint tensor: its file, name, dtype, shape and byte range (absolute offsets in the file)."""

    file: Path
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor, converted to `dtype`; CheckpointError if a value is not finite (in the file or after the
        conversion: bf16 holds values float16 cannot)."""
        return self.read_as([dtype or self.dtype])[0]

    def read_as(self, dtypes: Sequence[torch.dtype]) -> list[torch.Tensor]:
        """The tensor in each of `dtypes`, from one read of the file."""
        buffer = bytearray(self.nbytes)
        try:
            with open(self.file, "rb", buffering=0) as fh:
                fh.seek(self.begin)
                view, done = memoryview(buffer), 0
                while done < self.nbytes:
                    got = fh.readinto(view[done:])
                    if not got:
                        raise CheckpointError(f"{self.file} ended inside weight {self.name}: truncated; re-download it")
                    done += got
        except OSError as exc:
            raise CheckpointError(f"{self.file} cannot be read ({exc.strerror}); check the file") from exc
        if not buffer:
            return [torch.empty(self.shape, dtype=dtype) for dtype in dtypes]
        stored = torch.frombuffer(buffer, dtype=self.dtype).reshape(self.shape)
        outs = [stored if dtype == self.dtype else torch.empty(self.shape, dtype=dtype) for dtype in dtypes]
        src = stored.view(-1)
        for start in range(0, src.numel(), CHUNK):  # in pieces: no temporary as large as the tensor
            for out in outs:
                piece = out.view(-1)[start:start + CHUNK]
                if out is not stored:
                    piece.copy_(src[start:start + CHUNK])
                if not bool(torch.isfinite(piece).all()):
                    finite_weight(out, self.name, self.file.parent)  # raises, naming the weight and the dtype
        return outs


def weight_sources(weights: CheckpointWeights) -> dict[str, WeightSource]:
    """Internal parameter name -> its source, for every parameter of the model, each shape checked against
    config.json (the headers only are read: nothing is loaded)."""
    with torch.device("meta"):
        model = MaskPredictor(weights.config)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    headers: dict[Path, dict[str, dict[str, object]]] = {}
    sources: dict[str, WeightSource] = {}
    for internal, external in weights.names.items():
        file = weights.files[external]
        if file not in headers:
            headers[file] = safetensors_header(file, "checkpoint weights", error=CheckpointError)
        entry = headers[file][external]
        dtype = SAFETENSORS_DTYPES.get(str(entry["dtype"]))
        if dtype is None:
            raise CheckpointError(f"{file}: weight {external} is stored as {entry['dtype']}; only "
                                  f"{', '.join(SAFETENSORS_DTYPES)} weights are read: re-save the checkpoint in bf16")
        shape = tuple(int(d) for d in entry["shape"])  # type: ignore[attr-defined]
        if shape != shapes[internal]:
            raise CheckpointError(f"{weights.path}: weight {external} has shape {shape}, but config.json implies "
                                  f"{shapes[internal]}; the config and the weights disagree")
        offsets: list[int] = entry["data_offsets"]  # type: ignore[assignment]
        base = 8 + _header_length(file)
        sources[internal] = WeightSource(file, external, dtype, shape, base + offsets[0], base + offsets[1])
    return sources


def _header_length(file: Path) -> int:
    with open(file, "rb") as fh:
        return int.from_bytes(fh.read(8), "little")


@contextmanager
def materialized(models: Mapping[torch.dtype, MaskPredictor], sources: Mapping[str, WeightSource],
                 prefix: str = "") -> Iterator[None]:
    """The parameters under `prefix` of models built on the meta device (one per dtype) read from their sources for
    the block, each tensor read once for every model, then put back on the meta device: the memory of one part of
    the model, held only while it runs."""
    names = [name for name in sources if name.startswith(prefix)]
    dtypes = list(models)
    for name in names:
        for dtype, tensor in zip(dtypes, sources[name].read_as(dtypes), strict=True):
            _assign(models[dtype], name, nn.Parameter(tensor, requires_grad=False))
    _tie(models, names)
    try:
        yield
    finally:
        for name in names:
            for dtype, model in models.items():
                meta = torch.empty(sources[name].shape, dtype=dtype, device="meta")
                _assign(model, name, nn.Parameter(meta, requires_grad=False))
        _tie(models, names)


def _tie(models: Mapping[torch.dtype, MaskPredictor], names: list[str]) -> None:
    for model in models.values():
        if model.cfg.tie_embeddings and "embed.weight" in names:
            model.lm_head.weight = model.embed.weight


def shaped_model(cfg: ModelConfig, dtype: torch.dtype) -> MaskPredictor:
    """The model with every parameter `torch.empty` in `dtype`: under a FakeTensorMode, a model to trace that holds
    no weights (built on the meta device first, so no initialisation runs)."""
    with torch.device("meta"):
        model = MaskPredictor(cfg)
    for name, param in list(model.named_parameters()):
        _assign(model, name, nn.Parameter(torch.empty(param.shape, dtype=dtype), requires_grad=False))
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    return model.eval()


def _assign(model: nn.Module, name: str, value: nn.Parameter) -> None:
    owner, _, leaf = name.rpartition(".")
    model.get_submodule(owner)._parameters[leaf] = value
