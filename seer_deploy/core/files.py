"""Reading files the user hands us, one reader per kind, each failure one line naming the file and the fix.

Everything read from disk goes through here: text (`read_text`), JSON (`read_json`), safetensors headers
(`safetensors_header`), and paths named inside such files (`confined`), which must stay inside their own
directory, symlinks included, before anything is opened. Also the content hash several layers check.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import ConfigError, SeerDeployError

CHUNK_BYTES = 1 << 24  # 16 MiB: weights files can be tens of GB
MAX_TEXT_BYTES = 256 << 20  # configs, indexes, manifests, prompts: a large tokenizer.json is ~30 MB
MAX_SAFETENSORS_HEADER = 100_000_000  # safetensors' own limit on the JSON header
SAFETENSORS_DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8,
}
ErrorType = type[SeerDeployError]


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


def os_error_fix(exc: OSError) -> str:
    """What the user can do about an OS error, by its errno."""
    fixes = {
        errno.ENOENT: "check the path",
        errno.EACCES: "check its permissions",
        errno.EPERM: "check its permissions",
        errno.EROFS: "the file system is read-only: choose a writable location",
        errno.ENOSPC: "free some disk space",
        errno.EDQUOT: "free some disk space (quota exceeded)",
        errno.ENAMETOOLONG: "use a shorter path",
        errno.ELOOP: "fix the symbolic link loop",
        errno.EISDIR: "give a file, not a directory",
        errno.ENOTDIR: "a part of the path is not a directory: check the path",
        errno.EEXIST: "remove it or choose another path",
    }
    return fixes.get(exc.errno or 0, "check the path and the file system")


def regular_file(path: str | os.PathLike[str], what: str, *, fix: str = "", error: ErrorType = ConfigError) -> Path:
    """`path` as a Path when it is an existing regular file (symlinks followed); else `error` naming what is wrong.

    Checked before opening: a FIFO or a device (/dev/zero) named where a file belongs would block or never end."""
    file = Path(path)
    try:
        info = file.stat()
    except FileNotFoundError:
        raise error(f"{what} {file} is missing" + (f"; {fix}" if fix else "; check the path")) from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        hint = os_error_fix(exc) if isinstance(exc, OSError) else "check the path"
        raise error(f"{what} {file} cannot be read ({reason}); {hint}") from exc
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise error(f"{what} {file} is {kind}; give the path of a regular file")
    return file


def read_bytes(
    path: str | os.PathLike[str], what: str, *, fix: str = "", error: ErrorType = ConfigError,
    max_bytes: int = MAX_TEXT_BYTES,
) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; every failure one `error` naming the file."""
    file = regular_file(path, what, fix=fix, error=error)
    try:
        with open(file, "rb") as fh:
            too_large = os.fstat(fh.fileno()).st_size > max_bytes
            data = b"" if too_large else fh.read(max_bytes + 1)  # the cap: a file may grow while it is read
    except OSError as exc:
        raise error(f"{what} {file} cannot be read ({exc.strerror}); {os_error_fix(exc)}") from exc
    if too_large or len(data) > max_bytes:
        raise error(f"{what} {file} is larger than {max_bytes >> 20} MiB; it cannot be a {what}: check the path")
    return data


def decode_utf8(data: bytes, file: str | os.PathLike[str], what: str, *, error: ErrorType = ConfigError) -> str:
    """UTF-8 text (a leading byte-order mark dropped); a non-UTF-8 byte is named with its offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise error(f"{what} {file} is not UTF-8 text (byte 0x{bad} at offset {exc.start}); save it as UTF-8") from exc


def read_text(
    path: str | os.PathLike[str], what: str, *, fix: str = "", error: ErrorType = ConfigError,
    max_bytes: int = MAX_TEXT_BYTES,
) -> str:
    """A UTF-8 text file; `what` names it in errors ("checkpoint config"), `fix` says what to do if it is missing."""
    return decode_utf8(read_bytes(path, what, fix=fix, error=error, max_bytes=max_bytes), path, what, error=error)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON value {name}")


def parse_json(text: str, file: str | os.PathLike[str], what: str, *, error: ErrorType = ConfigError) -> Any:
    """JSON text -> Python value; NaN / Infinity (not JSON) and absurd nesting are refused like a syntax error."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{what} {file} is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); fix it or "
                    "re-create it") from exc
    except ValueError as exc:
        raise error(f"{what} {file} is not valid JSON ({exc}); write numbers as finite decimals") from exc
    except RecursionError:
        raise error(f"{what} {file} is nested too deeply to be a {what}; check the file") from None


def read_json(
    path: str | os.PathLike[str], what: str, *, fix: str = "", error: ErrorType = ConfigError,
    max_bytes: int = MAX_TEXT_BYTES, expect: type = dict,
) -> Any:
    """A JSON file whose top level is an `expect` (an object unless told); every failure one `error` naming it."""
    value = parse_json(read_text(path, what, fix=fix, error=error, max_bytes=max_bytes), path, what, error=error)
    if not isinstance(value, expect):
        names: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}
        wanted = names.get(expect, expect.__name__)
        raise error(f"{what} {path} holds {_json_kind(value)}, not {wanted}; check the file")
    return value


def _json_kind(value: Any) -> str:
    kinds = [(bool, "a boolean"), (dict, "an object"), (list, "an array"), (str, "a string"), (int, "a number"),
             (float, "a number"), (type(None), "null")]
    return next(name for kind, name in kinds if isinstance(value, kind))


def confined(base_dir: str | os.PathLike[str], relative: object, what: str, *, error: ErrorType = ConfigError) -> Path:
    """The resolved path of `relative` (a name read from a file in `base_dir`), which must lie inside `base_dir`.

    Refused before anything is opened: a non-string or empty name, an absolute path, and any name that resolves
    (through `..` or symbolic links) to `base_dir` itself or outside it."""
    if not isinstance(relative, str) or not relative.strip() or "\x00" in relative:
        raise error(f"{what} {relative!r} is not a file name; name a file inside {base_dir}")
    if os.path.isabs(relative) or relative.startswith("~"):
        raise error(f"{what} '{relative}' is an absolute path; files must be named relative to {base_dir}")
    try:
        base = Path(base_dir).resolve()
        target = (base / relative).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop: RuntimeError before Python 3.13, OSError after
        raise error(f"{what} '{relative}' cannot be resolved inside {base_dir} ({exc}); fix the name") from exc
    if target == base or not target.is_relative_to(base):
        raise error(f"{what} '{relative}' resolves to {target}, outside {base}; refusing to open it: name a file "
                    f"inside {base}")
    return target


def safetensors_header(path: str | os.PathLike[str], what: str, *, error: ErrorType = ConfigError) -> dict[str, Any]:
    """The tensor entries of a safetensors file's header ({name: {dtype, shape, data_offsets}}), after checking
    that the header is well formed and the file's size is exactly what it describes (nothing is hashed or
    loaded from a truncated file, or from something that is not a safetensors file at all)."""
    file = regular_file(path, what, error=error)

    def refuse(detail: str) -> SeerDeployError:
        return error(f"{what} {file} is not a readable safetensors file ({detail}); re-download or re-save it")

    try:
        with open(file, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            length = int.from_bytes(fh.read(8), "little") if size >= 8 else -1
            if not 2 <= length <= min(MAX_SAFETENSORS_HEADER, size - 8):
                raise refuse(f"{size} bytes, header length {length}")
            raw = fh.read(length)
    except OSError as exc:
        raise error(f"{what} {file} cannot be read ({exc.strerror}); {os_error_fix(exc)}") from exc
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise refuse(f"its header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise refuse("its header is not a JSON object")
    end = 0
    for name, entry in header.items():
        if name != "__metadata__":
            end = max(end, _tensor_end(name, entry, refuse))
    if 8 + length + end != size:
        raise refuse(f"{size} bytes, but its header describes {8 + length + end}: truncated or padded")
    return {name: entry for name, entry in header.items() if name != "__metadata__"}


def _tensor_end(name: str, entry: Any, refuse: Callable[[str], SeerDeployError]) -> int:
    """Where one tensor's bytes end, after checking its header entry (offsets, and size where the dtype is known)."""
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    shape = entry.get("shape") if isinstance(entry, dict) else None
    ok = (
        isinstance(offsets, list) and len(offsets) == 2 and all(_whole(v) and v >= 0 for v in offsets)
        and offsets[0] <= offsets[1] and isinstance(shape, list) and all(_whole(v) and v >= 0 for v in shape)
    )
    if not ok:
        raise refuse(f"the header entry of tensor {name!r} is malformed")
    assert isinstance(entry, dict) and isinstance(offsets, list) and isinstance(shape, list)
    width = SAFETENSORS_DTYPE_BYTES.get(str(entry.get("dtype")))
    if width is not None and math.prod(shape) * width != offsets[1] - offsets[0]:
        size = offsets[1] - offsets[0]
        raise refuse(f"tensor {name!r} ({entry.get('dtype')} {shape}) does not fill its {size} bytes")
    return int(offsets[1])


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
