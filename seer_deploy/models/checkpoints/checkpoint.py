"""Local checkpoint directories: LLaDA's original weight names or Llama-style names, one file or sharded.

A checkpoint directory holds `config.json`, `model.safetensors` (or shards listed by
`model.safetensors.index.json`) and `tokenizer.json`. The layout is detected from the weight names.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from seer_deploy.core.atomic import honour_umask, install_dir, staging_dir
from seer_deploy.core.errors import CheckpointError
from seer_deploy.models.checkpoints.checkpoint_files import (  # noqa: F401  (DEMO_NAMES, checkpoint_fingerprint: for the exporter)
    DEMO_NAMES,
    INDEX_FILE,
    SINGLE_FILE,
    checkpoint_fingerprint,
    read_config,
    resolve_checkpoint,
    weight_files,
)
from seer_deploy.models.families.config import ModelConfig, config_from_dict
from seer_deploy.models.families.families import DIMPLE_VISION_PREFIXES
from seer_deploy.models.families.family_configs import family_config_dict
from seer_deploy.models.networks.llada import MaskPredictor

Layout = Literal["llada", "llama"]

# Internal parameter name -> per-layout name. "{i}" is the transformer layer index.
_LAYER_NAMES: dict[Layout, dict[str, str]] = {
    "llada": {
        "attn_norm.weight": "model.transformer.blocks.{i}.attn_norm.weight",
        "attn.q.weight": "model.transformer.blocks.{i}.q_proj.weight",
        "attn.k.weight": "model.transformer.blocks.{i}.k_proj.weight",
        "attn.v.weight": "model.transformer.blocks.{i}.v_proj.weight",
        "attn.o.weight": "model.transformer.blocks.{i}.attn_out.weight",
        "mlp_norm.weight": "model.transformer.blocks.{i}.ff_norm.weight",
        "mlp.gate.weight": "model.transformer.blocks.{i}.ff_proj.weight",
        "mlp.up.weight": "model.transformer.blocks.{i}.up_proj.weight",
        "mlp.down.weight": "model.transformer.blocks.{i}.ff_out.weight",
    },
    "llama": {
        "attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "attn.q.weight": "model.layers.{i}.self_attn.q_proj.weight",
        "attn.k.weight": "model.layers.{i}.self_attn.k_proj.weight",
        "attn.v.weight": "model.layers.{i}.self_attn.v_proj.weight",
        "attn.o.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "mlp_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "mlp.gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
        "mlp.up.weight": "model.layers.{i}.mlp.up_proj.weight",
        "mlp.down.weight": "model.layers.{i}.mlp.down_proj.weight",
    },
}
_TOP_NAMES: dict[Layout, dict[str, str]] = {
    "llada": {
        "embed.weight": "model.transformer.wte.weight",
        "final_norm.weight": "model.transformer.ln_f.weight",
        "lm_head.weight": "model.transformer.ff_out.weight",
    },
    "llama": {
        "embed.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    },
}
# Weights that belong to other parts of multimodal checkpoints; the language model ignores them.
MULTIMODAL_PREFIXES = ("model.vision_tower.", "model.mm_projector.", "model.image_newline", "vision_tower.", "mm_projector.")


def weight_name_map(cfg: ModelConfig, layout: Layout) -> dict[str, str]:
    """Internal parameter name -> checkpoint weight name, for every weight the checkpoint must hold."""
    names = {k: v for k, v in _TOP_NAMES[layout].items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    for i in range(cfg.n_layers):
        for internal, external in _layer_names(cfg, layout).items():
            names[f"layers.{i}.{internal}"] = external.format(i=i)
    return names


def _layer_names(cfg: ModelConfig, layout: Layout) -> dict[str, str]:
    """One layer's names, with the family options' weights: q/k/v biases (Qwen2), q/k norms and MoE experts
    (OLMoE-style, as LLaDA-MoE names them)."""
    names = dict(_LAYER_NAMES[layout])
    attn = names["attn.q.weight"].removesuffix("q_proj.weight")  # "model.layers.{i}.self_attn." or the block's
    if cfg.qkv_bias:
        names.update({f"attn.{p}.bias": f"{attn}{p}_proj.bias" for p in "qkv"})
    if cfg.qk_norm:
        names.update({f"attn.{p}_norm.weight": f"{attn}{p}_norm.weight" for p in "qk"})
    if cfg.num_experts:
        mlp = names.pop("mlp.gate.weight").removesuffix("gate_proj.weight").removesuffix("ff_proj.weight")
        del names["mlp.up.weight"], names["mlp.down.weight"]
        names["mlp.router.weight"] = f"{mlp}gate.weight"
        for e in range(cfg.num_experts):
            names.update({f"mlp.experts.{e}.{p}.weight": f"{mlp}experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down")})
    return names


def detect_layout(weight_names: list[str]) -> Layout:
    """Tell the layout from the weight names; an unknown layout names a few of the keys it saw."""
    if any(n.startswith("model.transformer.") for n in weight_names):
        return "llada"
    if any(n.startswith(("model.layers.", "model.embed_tokens.")) for n in weight_names):
        return "llama"
    sample = ", ".join(sorted(weight_names)[:5]) or "(no weights)"
    raise CheckpointError(
        f"unknown checkpoint layout: weight names are neither LLaDA's (model.transformer.blocks.N...) nor "
        f"Llama-style (model.layers.N...); first keys: {sample}"
    )


@dataclass
class LoadedCheckpoint:
    model: MaskPredictor
    config: ModelConfig
    layout: Layout
    path: Path


@dataclass
class WithLanguageModel:
    """A picture model's checkpoint: its language model (as load_checkpoint gives it) beside what sees the pictures;
    its config and path are the language model's."""

    lm: LoadedCheckpoint

    @property
    def config(self) -> ModelConfig:
        return self.lm.config

    @property
    def path(self) -> Path:
        return self.lm.path


@dataclass(frozen=True)
class CheckpointWeights:
    """Where a checkpoint's language-model weights are, read from its files without loading any: what loading and a
    streamed export both start from."""

    path: Path
    config: ModelConfig
    layout: Layout
    names: dict[str, str]  # internal parameter name -> the checkpoint's weight name
    files: dict[str, Path]  # the checkpoint's weight name -> the safetensors file that holds it


def checkpoint_weights(name_or_path: str | os.PathLike[str],
                       ignore_prefixes: tuple[str, ...] = MULTIMODAL_PREFIXES) -> CheckpointWeights:
    """The config, layout and weight names of a local checkpoint, every weight the model needs present and no
    other (CheckpointError naming them otherwise)."""
    from seer_deploy.models.text.tokenizer import special_ids_from_tokenizer_file

    path = resolve_checkpoint(name_or_path)
    raw = read_config(path)
    special = special_ids_from_tokenizer_file(path / "tokenizer.json")
    cfg = config_from_dict(raw, special)
    files = weight_files(path)
    if cfg.family == "dimple":  # the vision tower and projector: models.checkpoints.dimple
        ignore_prefixes = (*ignore_prefixes, *DIMPLE_VISION_PREFIXES)
    names = [n for n in files if not n.startswith(ignore_prefixes)]
    layout = detect_layout(names)
    expected = weight_name_map(cfg, layout)
    wanted = set(expected.values())
    missing = sorted(wanted - set(names))
    unexpected = sorted(set(names) - wanted)
    if cfg.tie_embeddings and _TOP_NAMES[layout]["lm_head.weight"] in unexpected:
        unexpected.remove(_TOP_NAMES[layout]["lm_head.weight"])  # some tied checkpoints still store the head
    if missing:
        raise CheckpointError(f"{path}: missing weights for a {cfg.family} checkpoint ({layout} layout): "
                              f"{_list(missing)}")
    if unexpected:
        raise CheckpointError(f"{path}: unexpected weights (not part of a {cfg.family} model in the {layout} "
                              f"layout): {_list(unexpected)}")
    return CheckpointWeights(path, cfg, layout, expected, {name: files[name] for name in wanted})


def load_checkpoint(
    name_or_path: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    ignore_prefixes: tuple[str, ...] = MULTIMODAL_PREFIXES,
) -> LoadedCheckpoint:
    """Load a local checkpoint of either layout into a MaskPredictor in eval mode."""
    weights = checkpoint_weights(name_or_path, ignore_prefixes)
    path, cfg, layout, expected, files = weights.path, weights.config, weights.layout, weights.names, weights.files
    with torch.device("meta"):
        model = MaskPredictor(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for internal, external in expected.items():
        by_file.setdefault(files[external], []).append((internal, external))
    for file, pairs in by_file.items():
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                for internal, external in pairs:
                    tensor = f.get_tensor(external)
                    if tuple(tensor.shape) != shapes[internal]:
                        raise CheckpointError(
                            f"{path}: weight {external} has shape {tuple(tensor.shape)}, but config.json implies "
                            f"{shapes[internal]}; the config and the weights disagree"
                        )
                    state[internal] = finite_weight(tensor.to(device=device, dtype=dtype), external, path)
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{file} is not a readable safetensors file ({exc}); re-download or re-save it") from exc
    model.load_state_dict(state, strict=not cfg.tie_embeddings, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    model.eval().requires_grad_(False)
    return LoadedCheckpoint(model=model, config=cfg, layout=layout, path=path)


def finite_weight(tensor: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    """The tensor, if every value is finite: NaN or infinite weights (or an overflow of the load dtype) would
    surface much later as garbage answers or as a disagreement between backends."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise CheckpointError(
            f"{path}: weight {name} holds NaN or infinite values (in {str(tensor.dtype).removeprefix('torch.')}); "
            "the checkpoint is damaged, or too large for this dtype: re-download it or load it in float32"
        )
    return tensor


def _list(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def save_checkpoint(
    model: MaskPredictor,
    path: str | os.PathLike[str],
    layout: Layout = "llada",
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int | None = None,
    tokenizer_file: str | os.PathLike[str] | None = None,
    extra_files: dict[str, str] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a checkpoint directory in `layout`; sharded with an index when `max_shard_bytes` is set. A model of
    another family (ModelConfig.family) gets that family's public config.json (models.families.families); `extra_tensors` are
    stored beside the model's weights (e.g. a vision tower the language model ignores).

    The directory is written next to its destination and renamed into place, so a failure leaves nothing behind.
    """
    cfg = model.cfg
    dest = Path(path)
    with staging_dir(dest, "write") as tmp:
        params = dict(model.named_parameters())
        tensors = {
            external: params[internal].detach().to(dtype or params[internal].dtype).contiguous().cpu()
            for internal, external in weight_name_map(cfg, layout).items()
        }
        tensors.update({name: t.contiguous() for name, t in (extra_tensors or {}).items()})
        if cfg.family != "llada":
            config = family_config_dict(cfg)
        else:
            config = cfg.config_json("llada" if layout == "llada" else "llama")
        config["torch_dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if max_shard_bytes is None:
            save_safetensors(tensors, tmp / SINGLE_FILE)
        else:
            _save_sharded(tensors, tmp, max_shard_bytes)
        if tokenizer_file is not None:
            shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        install_dir(tmp, dest)
    return dest


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors' save_file, with the file's mode from the umask (save_file leaves it 0600)."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    honour_umask(path)


def _save_sharded(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map: dict[str, str] = {}
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_safetensors(shard, out / fname)
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
