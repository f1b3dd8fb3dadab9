"""Writing outputs safely: atomic files, directories built beside their destination and renamed into place, their
removal when the process is stopped, the removal of what killed runs left behind, and ownership of outputs.

Readers (and a crash) see the old file or directory or the new one, never half of one. A temporary carries the
writer's PID in its name (`.NAME.TAG-PID-RAND/`, `.NAME.PID.RAND.tmp`), so a later run can tell a live writer's
temporary from debris of a dead one (`remove_stale_temporaries`). `cleanup_on_signals` turns SIGTERM / SIGHUP /
SIGINT into exceptions, so the `except BaseException` cleanups run when a run is stopped. An output directory is
replaced only when it carries this tool's marker for that kind of artifact (`claim`, `check_replaceable`).

Temp files are created with open(..., "x"), not mkstemp, and directories with mkdir, not mkdtemp: their 0600 /
0700 modes would make configs, manifests and engines unreadable to other users; open() and mkdir honour the umask.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from seer_deploy.core.errors import ArtifactError, SeerDeployError
from seer_deploy.core.files import read_json

OWNER_FILE = ".seer-deploy.json"  # the marker: which kind of artifact, of which model, holding which files
OWNER_FORMAT = "seer-deploy-owner"
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call write(tmp) on a fresh temp file beside `path`, fsync it, then rename it over `path` (what write returns
    is ignored)."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    with cleanup_on_signals():
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
    """A fresh directory next to `dest` to build it in, for install_dir; stale temporaries of dead runs beside
    `dest` are removed first. `tag` is a word (letters, digits, _) naming the writer: 'export', 'build'."""
    if not re.fullmatch(r"\w+", tag):
        raise ValueError(f"temp_dir_beside: tag {tag!r} must be a word")
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dest)
    tmp = dest.parent / f".{dest.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


@contextmanager
def staging_dir(dest: Path, tag: str) -> Iterator[Path]:
    """A temp directory beside `dest` (see temp_dir_beside) for the block to fill and install_dir into place; it is
    removed when the block raises or the process is stopped by SIGTERM, SIGHUP or SIGINT."""
    with cleanup_on_signals():
        tmp = temp_dir_beside(dest, tag)
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already once install_dir moved it into place


def honour_umask(path: Path) -> None:
    """Give a file the mode a plain open() would have: safetensors' save_file writes 0600 whatever the umask."""
    mask = os.umask(0o022)  # reading the umask means setting it; restored at once
    os.umask(mask)
    path.chmod(0o666 & ~mask)


def install_dir(tmp: Path, out: Path) -> None:
    """Rename a finished directory `tmp` (a sibling of `out`) into place; an existing `out` is moved aside first,
    restored if the rename fails, and removed after. A crash never leaves a half-written `out`; a kill between the
    two renames leaves the old `out` aside, and the next run beside `out` puts it back."""
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


# --- stopping and debris -------------------------------------------------------------------------------------------


def _stop(signum: int, frame: FrameType | None) -> None:
    """Raise in the main thread so that cleanups run; a second signal is ignored so it cannot cut a cleanup short."""
    signal.signal(signum, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """For the block's duration, SIGTERM and SIGHUP raise SystemExit(128 + signal) and SIGINT KeyboardInterrupt in
    the main thread (a repeat is ignored), so `except BaseException` and `finally` cleanups run; the previous
    handlers are restored after. Signals a parent set to be ignored stay ignored. A no-op outside the main thread,
    where Python cannot handle signals. SIGKILL cannot be caught: `remove_stale_temporaries` handles its debris."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in STOP_SIGNALS:
        handler = signal.getsignal(sig)
        if handler in (signal.SIG_DFL, signal.default_int_handler):
            previous[sig] = signal.signal(sig, _stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists (ours counts: a thread of this process may be writing)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    except (OverflowError, ValueError):
        return False
    return True


def remove_stale_temporaries(dest: Path) -> list[Path]:
    """Remove the temporaries beside `dest` that runs killed before their cleanup left behind (their PID is in
    the name and no longer runs); a moved-aside old `dest` (`...old`) is put back when `dest` is missing. Returns
    what was removed or restored. Temporaries of live processes are left alone."""
    pattern = re.compile(
        rf"^\.{re.escape(dest.name)}\.(?:\w+-(?P<pid>\d+)-[0-9a-f]{{8}}(?P<old>\.old)?|(?P<file_pid>\d+)\.[0-9a-f]{{8}}\.tmp)$"
    )
    try:
        entries = list(dest.parent.iterdir())
    except OSError:
        return []
    handled = []
    for entry in sorted(entries, key=lambda p: p.name):
        match = pattern.match(entry.name)
        if match is None or _pid_alive(int(match["pid"] or match["file_pid"])):
            continue
        if match["old"] and not dest.exists() and not dest.is_symlink():
            os.replace(entry, dest)  # killed between install_dir's two renames: the old output comes back
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        handled.append(entry)
    return handled


# --- ownership ------------------------------------------------------------------------------------------------------


def claim(directory: Path, kind: str, fingerprint: str | None) -> Path:
    """Mark a finished directory as this tool's `kind` of artifact ('export', 'engine') of the model `fingerprint`,
    listing the files in it now; call it last, just before install_dir."""
    files = sorted(p.name for p in directory.iterdir() if p.name != OWNER_FILE)
    marker = {"format": OWNER_FORMAT, "kind": kind, "fingerprint": fingerprint, "files": files}
    return write_text_atomic(directory / OWNER_FILE, json.dumps(marker, indent=1) + "\n")


def _ours(path: Path) -> bool:
    """A directory that carries a readable marker of its own: an artifact of ours nested later (export --build)."""
    if path.is_symlink() or not (path / OWNER_FILE).is_file():
        return False
    try:
        return read_json(path / OWNER_FILE, "ownership marker").get("format") == OWNER_FORMAT
    except SeerDeployError:
        return False


def _names(paths: list[Path], limit: int = 5) -> str:
    shown = [p.name + ("/" if p.is_dir() else "") for p in sorted(paths)[:limit]]
    return ", ".join(shown) + (f" (+{len(paths) - limit} more)" if len(paths) > limit else "")


def check_replaceable(out: Path, kind: str, fingerprint: str | None, force: bool, what: str = "--out") -> None:
    """ArtifactError unless `out` may be replaced by a new `kind` artifact of the model `fingerprint`: it is missing,
    an empty directory, or carries this tool's marker for `kind` and holds only the files listed there (or
    directories with a marker of their own: an engine built into an export), and (without `force`) is of the same
    model. `force` replaces our own artifact of another model, never anything
    else. `what` names `out` in messages."""
    if out.is_symlink():
        raise ArtifactError(f"{what} {out} is a symbolic link; give the path of a real directory")
    if not out.exists():
        return
    if not out.is_dir():
        raise ArtifactError(f"{what} {out} is a file, not a directory; choose another {what}")
    entries = list(out.iterdir())
    if not entries:
        return
    marker_file = out / OWNER_FILE
    if not marker_file.is_file():
        raise ArtifactError(
            f"{what} {out} holds files seer-deploy did not write ({_names(entries)}); refusing to replace it, with or "
            f"without --force: choose a new or empty directory"
        )
    try:
        marker = read_json(marker_file, "ownership marker", error=ArtifactError)
    except SeerDeployError as exc:
        raise ArtifactError(f"{exc} (refusing to replace {out}: remove it yourself if it is yours)") from exc
    listed = marker.get("files")
    if marker.get("format") != OWNER_FORMAT or not isinstance(listed, list):
        raise ArtifactError(
            f"{marker_file} is not seer-deploy's marker; refusing to replace {out}: choose another {what}"
        )
    if marker.get("kind") != kind:
        raise ArtifactError(
            f"{what} {out} holds a seer-deploy {marker.get('kind')!r} artifact, not an {kind!r} one; refusing to "
            f"replace it: choose another {what}"
        )
    foreign = [p for p in entries if p.name != OWNER_FILE and p.name not in listed and not _ours(p)]
    if foreign:
        raise ArtifactError(
            f"{what} {out} holds files seer-deploy did not write there ({_names(foreign)}); move them out or choose "
            f"another {what}"
        )
    theirs = marker.get("fingerprint")
    if not force and fingerprint is not None and theirs != fingerprint:
        raise ArtifactError(
            f"{what} {out} holds the {kind} of another model (fingerprint {str(theirs)[:12]}); pass --force to "
            f"replace it, or choose another {what}"
        )
