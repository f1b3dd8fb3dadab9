"""A checkpoint directory's files, read without loading any weights: where it is, its config.json, which
safetensors file holds each weight, and its fingerprint. Pure file work (no torch), so an export's run path can
find its source checkpoint's tokenizer and Seer config without importing torch."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import CheckpointError
from seer_deploy.core.files import confined, read_json, safetensors_header, update_from_file

DEMO_NAMES = ("demo",)
DEMO_DIR = Path(__file__).parents[1] / "demos" / "demo"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def resolve_checkpoint(name_or_path: str | os.PathLike[str]) -> Path:
    """'demo' -> the bundled demo checkpoint; anything else must be an existing local directory."""
    if str(name_or_path) in DEMO_NAMES:
        return DEMO_DIR
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist; give a local checkpoint directory or 'demo'")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint '{path}' is not a directory; give the folder that holds config.json")
    return path


def read_config(path: Path) -> dict[str, Any]:
    """A checkpoint's config.json as a JSON object (CheckpointError naming the file otherwise)."""
    config: dict[str, Any] = read_json(path / "config.json", "checkpoint config", error=CheckpointError,
                                       fix="a checkpoint directory needs config.json")
    return config


def weight_files(path: Path) -> dict[str, Path]:
    """Weight name -> the safetensors file that holds it (from the index, or the single file).

    Every file named by the index must lie inside the checkpoint directory (symlinks resolved) and have a
    safetensors header that matches its size; both are checked before any file is hashed or loaded."""
    index = path / INDEX_FILE
    if index.is_file() or index.is_symlink():
        weight_map = read_json(index, "safetensors index", error=CheckpointError).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} is not a valid safetensors index (needs a non-empty 'weight_map' object "
                                  "of weight name -> shard file); re-download it")
        shards = {shard: _shard_path(path, shard) for shard in sorted(set(map(_shard_name, weight_map.values())))}
        headers = {shard: safetensors_header(file, "checkpoint shard", error=CheckpointError)
                   for shard, file in shards.items()}
        for name, shard in weight_map.items():
            if name not in headers[shard]:
                raise CheckpointError(f"{index} places weight {name} in {shard}, which does not hold it; re-download "
                                      "the checkpoint")
        return {name: shards[shard] for name, shard in weight_map.items()}
    single = path / SINGLE_FILE
    if single.is_file():
        return {name: single for name in safetensors_header(single, "checkpoint weights", error=CheckpointError)}
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise CheckpointError(
            f"{path} holds PyTorch pickle weights; only safetensors are read. Convert them with "
            "transformers' save_pretrained(..., safe_serialization=True)"
        )
    raise CheckpointError(f"no weights in {path}: expected {SINGLE_FILE} or {INDEX_FILE} with its shards")


def _shard_name(value: object) -> str:
    if not isinstance(value, str):
        raise CheckpointError(f"{INDEX_FILE}: shard {value!r} is not a file name; weight_map values name shard files")
    return value


def _shard_path(path: Path, shard: str) -> Path:
    """The shard's resolved path inside the checkpoint directory; CheckpointError if it is elsewhere or missing."""
    file = confined(path, shard, f"shard listed in {INDEX_FILE}", error=CheckpointError)
    if not file.is_file():
        raise CheckpointError(f"shard {shard} listed in {INDEX_FILE} is missing from {path}; re-download it")
    return file


def checkpoint_fingerprint(path: str | os.PathLike[str]) -> str:
    """sha256 over config.json and every weight file's bytes: identifies the exact weights an artifact came from."""
    root = resolve_checkpoint(path)
    digest = hashlib.sha256()
    files = sorted({p for p in weight_files(root).values()})
    for file in [root / "config.json", *files]:
        digest.update(file.name.encode())
        update_from_file(digest, file)
    return digest.hexdigest()


