"""Atomic writes, debris of killed runs, stop signals and ownership of outputs (killed real runs: test_signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from seer_deploy.core.atomic import (
    OWNER_FILE,
    check_replaceable,
    claim,
    cleanup_on_signals,
    install_dir,
    remove_stale_temporaries,
    staging_dir,
    temp_dir_beside,
    write_atomic,
    write_text_atomic,
)
from seer_deploy.core.errors import ArtifactError


def test_write_replaces_the_file_and_honours_the_umask(tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "config.json"
    old = os.umask(0o022)
    try:
        write_text_atomic(dest, "one")
        write_text_atomic(dest, "two")
    finally:
        os.umask(old)
    assert dest.read_text() == "two"
    assert dest.stat().st_mode & 0o777 == 0o644  # mkstemp would give 0600: unreadable to other users
    assert sorted(p.name for p in dest.parent.iterdir()) == ["config.json"]


def test_a_failing_writer_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    dest = tmp_path / "engine.json"
    dest.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(dest, half_then_fail)
    assert dest.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["engine.json"]


def test_install_dir_swaps_a_directory_and_removes_the_old_one(tmp_path: Path) -> None:
    out = tmp_path / "export"
    for content in ("first", "second"):
        tmp = tmp_path / f".export.{content}"
        tmp.mkdir()
        (tmp / "manifest.json").write_text(content)
        install_dir(tmp, out)
    assert (out / "manifest.json").read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporaries_of_dead_runs_are_removed_live_ones_kept(tmp_path: Path) -> None:
    out = tmp_path / "export"
    dead, live = _dead_pid(), os.getppid()
    stale_dir = tmp_path / f".export.export-{dead}-0123abcd"
    stale_file = tmp_path / f".export.{dead}.89abcdef.tmp"
    live_dir = tmp_path / f".export.build-{live}-0123abcd"
    other = tmp_path / f".exports.export-{dead}-0123abcd"  # another destination's temporary: not ours to judge
    for d in (stale_dir, live_dir, other):
        d.mkdir()
        (d / "weights.bin").write_bytes(b"x" * 100)
    stale_file.write_text("half")
    tmp = temp_dir_beside(out, "export")  # a new run beside --out cleans up first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live_dir.name, other.name, tmp.name])


def test_an_old_output_moved_aside_by_a_killed_install_comes_back(tmp_path: Path) -> None:
    out = tmp_path / "engine"
    aside = tmp_path / f".engine.build-{_dead_pid()}-0123abcd.old"
    aside.mkdir()
    (aside / "engine.json").write_text("old")
    assert remove_stale_temporaries(out) == [aside]
    assert (out / "engine.json").read_text() == "old" and not aside.exists()


def test_staging_dir_is_removed_when_the_block_fails(tmp_path: Path) -> None:
    with pytest.raises(KeyError), staging_dir(tmp_path / "out", "export") as tmp:
        (tmp / "graph.onnx").write_text("half")
        raise KeyError("boom")
    assert list(tmp_path.iterdir()) == []


def test_cleanup_on_signals_raises_and_restores_the_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped, cleanup_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
    assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def _artifact(path: Path, kind: str, fingerprint: str, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    claim(path, kind, fingerprint)
    return path


def test_ownership_our_artifact_of_the_same_model_is_replaceable(tmp_path: Path) -> None:
    out = _artifact(tmp_path / "x", "export", "abc", {"manifest.json": "{}", "step0.onnx": ""})
    check_replaceable(out, "export", "abc", force=False)
    check_replaceable(tmp_path / "missing", "export", "abc", force=False)
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", "export", "abc", force=False)
    marker = json.loads((out / OWNER_FILE).read_text())
    assert marker["files"] == ["manifest.json", "step0.onnx"] and marker["kind"] == "export"


def test_ownership_a_nested_artifact_of_ours_is_not_foreign(tmp_path: Path) -> None:
    out = _artifact(tmp_path / "x", "export", "abc", {"manifest.json": "{}"})
    _artifact(out / "engine", "engine", "abc", {"engine.json": "{}"})  # export --build adds it after the install
    check_replaceable(out, "export", "abc", force=False)
    (out / "seer.json").write_text("{}")  # a calibration result the user put there: replacing would delete it
    with pytest.raises(ArtifactError, match=r"did not write there \(seer.json\)"):
        check_replaceable(out, "export", "abc", force=True)


def test_ownership_another_model_needs_force(tmp_path: Path) -> None:
    out = _artifact(tmp_path / "x", "engine", "abc", {"engine.json": "{}"})
    with pytest.raises(ArtifactError, match="holds the engine of another model .*pass --force"):
        check_replaceable(out, "engine", "def", force=False)
    check_replaceable(out, "engine", "def", force=True)


@pytest.mark.parametrize("force", [False, True])
def test_ownership_foreign_directories_are_refused_even_with_force(tmp_path: Path, force: bool) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "engine.json").write_text("{}")  # looks like an engine, is not ours
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(ArtifactError, match=r"did not write \(engine.json, thesis.tex\).*with or without --force"):
        check_replaceable(mine, "engine", "abc", force=force)
    export = _artifact(tmp_path / "export", "export", "abc", {"manifest.json": "{}"})
    with pytest.raises(ArtifactError, match="holds a seer-deploy 'export' artifact, not an 'engine' one"):
        check_replaceable(export, "engine", "abc", force=force)
    (export / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match=r"did not write there \(notes.txt\)"):
        check_replaceable(export, "export", "abc", force=force)
    (export / OWNER_FILE).write_bytes(b"\xff")
    with pytest.raises(ArtifactError, match="not UTF-8.*refusing to replace"):
        check_replaceable(export, "export", "abc", force=force)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="is a file"):
        check_replaceable(tmp_path / "file", "export", "abc", force=force)
    (tmp_path / "link").symlink_to(export)
    with pytest.raises(ArtifactError, match="symbolic link"):
        check_replaceable(tmp_path / "link", "export", "abc", force=force)
