"""Atomic file writes: a temp file beside the destination, renamed into place, so readers (and a crash) see the old
file or the new one, never half of one.

The temp file is created with open(..., "x"), not mkstemp: mkstemp's 0600 mode would make configs, manifests and
engines unreadable to other users; open() honours the umask.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call write(tmp) on a fresh temp file beside `path`, fsync it, then rename it over `path` (what write returns
    is ignored)."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb"):
            pass
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text))


def temp_dir_beside(dest: Path, tag: str) -> Path:
    """A fresh directory next to `dest` to build it in, for install_dir. Not mkdtemp: its 0700 mode would carry over
    to the installed directory; mkdir honours the umask."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def honour_umask(path: Path) -> None:
    """Give a file the mode a plain open() would have: safetensors' save_file writes 0600 whatever the umask."""
    mask = os.umask(0o022)  # reading the umask means setting it; restored at once
    os.umask(mask)
    path.chmod(0o666 & ~mask)


def install_dir(tmp: Path, out: Path) -> None:
    """Rename a finished directory `tmp` (a sibling of `out`) into place; an existing `out` is moved aside first,
    restored if the rename fails, and removed after. A crash never leaves a half-written `out`."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = tmp.with_name(tmp.name + ".old")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
