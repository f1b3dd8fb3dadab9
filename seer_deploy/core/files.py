"""Facts about files on disk that several layers check: their content hash."""

from __future__ import annotations

import hashlib
import os
from typing import Any

CHUNK_BYTES = 1 << 24  # 16 MiB: weights files can be tens of GB


def update_from_file(digest: Any, path: str | os.PathLike[str]) -> None:
    """Feed a file's bytes to a hashlib digest in chunks."""
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    update_from_file(digest, path)
    return digest.hexdigest()
