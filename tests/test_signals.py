"""Real runs killed at several moments leave no debris: SIGTERM / SIGHUP / SIGINT remove the temporary directory at
once; SIGKILL's temporary is removed by the next run beside the same output. An existing output survives whole."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A writer shaped like the exporter: a temporary directory beside --out, a large-ish file written slowly, a
# moment before the install, then install_dir. `staging` uses staging_dir; `pattern` the exporter's own
# try / except BaseException cleanup under cleanup_on_signals.
WRITER = """
import shutil, sys, time
from pathlib import Path
from seer_deploy.core.atomic import cleanup_on_signals, install_dir, staging_dir, temp_dir_beside

out, mode = Path(sys.argv[1]), sys.argv[2]

def fill(tmp):
    with open(tmp / "weights.bin", "wb") as fh:
        for i in range(40):
            fh.write(b"w" * (1 << 16))
            fh.flush()
            if i == 0:
                print("writing", flush=True)
            time.sleep(0.01)
    (tmp / "manifest.json").write_text("new")
    print("installing", flush=True)
    time.sleep(0.3)

if mode == "staging":
    with staging_dir(out, "export") as tmp:
        fill(tmp)
        install_dir(tmp, out)
else:
    with cleanup_on_signals():
        tmp = temp_dir_beside(out, "export")
        try:
            fill(tmp)
            install_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
print("done", flush=True)
"""


def _start(tmp_path: Path, out: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen([sys.executable, str(script), str(out), mode], stdout=subprocess.PIPE, text=True)


def _kill_at(proc: subprocess.Popen[str], line: str, delay: float, sig: int) -> None:
    """Wait for the writer to print `line`, then `delay` seconds, then send `sig` and reap the process."""
    assert proc.stdout is not None
    while (got := proc.stdout.readline().strip()) != line:
        assert got, f"the writer ended before '{line}'"
    time.sleep(delay)
    proc.send_signal(sig)
    proc.wait(timeout=30)


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != "writer.py")


MOMENTS = [("writing", 0.0), ("writing", 0.15), ("installing", 0.05)]


@pytest.mark.parametrize("mode", ["staging", "pattern"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("moment", MOMENTS)
def test_a_stopped_run_removes_its_temporary(tmp_path: Path, mode: str, sig: int, moment: tuple[str, float]) -> None:
    out = tmp_path / "export"
    proc = _start(tmp_path, out, mode)
    _kill_at(proc, *moment, sig)
    assert proc.returncode != 0
    assert _siblings(out) == []  # no temporary, and no half-written output


@pytest.mark.parametrize("moment", MOMENTS)
def test_an_existing_output_survives_a_stopped_run_whole(tmp_path: Path, moment: tuple[str, float]) -> None:
    out = tmp_path / "export"
    out.mkdir()
    (out / "manifest.json").write_text("old")
    proc = _start(tmp_path, out, "pattern")
    _kill_at(proc, *moment, signal.SIGTERM)
    assert _siblings(out) == ["export"] and (out / "manifest.json").read_text() == "old"


@pytest.mark.parametrize("moment", MOMENTS)
def test_sigkill_debris_is_removed_by_the_next_run(tmp_path: Path, moment: tuple[str, float]) -> None:
    out = tmp_path / "export"
    proc = _start(tmp_path, out, "staging")
    _kill_at(proc, *moment, signal.SIGKILL)
    debris = [name for name in _siblings(out) if name.startswith(".export.export-")]
    assert len(debris) == 1 and (out.parent / debris[0] / "weights.bin").is_file()
    rerun = _start(tmp_path, out, "staging")
    assert rerun.communicate(timeout=60)[0].split() == ["writing", "installing", "done"]
    assert _siblings(out) == ["export"] and (out / "manifest.json").read_text() == "new"


# --- the real command line ------------------------------------------------------------------------------------------
# `seer-deploy export` and `seer-deploy build` on a tiny checkpoint, paused at a chosen moment (a function of the
# real code path is wrapped to print a line and sleep on its n-th call), then stopped. No product code is changed.
CLI = """
import importlib, sys, time
from seer_deploy.cli import main

where, n, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
if where != "-":
    module_name, name = where.rsplit(".", 1)
    module = importlib.import_module(module_name)
    real, calls = getattr(module, name), [0]

    def paused(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            print("paused", flush=True)
            time.sleep(30)
        return real(*args, **kwargs)

    setattr(module, name, paused)
main(argv)
"""
EXPORT_MOMENTS = [("seer_deploy.export.exporter.check_graph_files", 1),  # step.onnx written in the temporary
                  ("seer_deploy.export.exporter.install_dir", 1)]  # everything written, not yet renamed
BUILD_MOMENTS = [("seer_deploy.engines.build._build_ort", 1),  # the temporary made, nothing in it yet
                 ("seer_deploy.engines.build.install_dir", 1)]  # engine.json and the marker written


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny checkpoint and its export (no torch comparison), outside the directories the tests watch."""
    from conftest import tiny_model

    from seer_deploy.cli import main
    from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
    from seer_deploy.models.demos.demo_tasks import write_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    write_tokenizer(root / "tokenizer.json")
    save_checkpoint(tiny_model(), root / "ckpt", tokenizer_file=root / "tokenizer.json")
    with pytest.raises(SystemExit) as done:
        main(["export", str(root / "ckpt"), "--out", str(root / "export"), "--no-verify"])
    assert done.value.code in (0, None)
    return {"ckpt": root / "ckpt", "export": root / "export"}


def _cli(tmp_path: Path, argv: list[str], where: str = "-", n: int = 0) -> subprocess.Popen[str]:
    script = tmp_path / "cli.py"
    script.write_text(CLI)
    return subprocess.Popen([sys.executable, str(script), where, str(n), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stop_when_paused(proc: subprocess.Popen[str], sig: int) -> None:
    """Read the run's stdout up to its 'paused' line (results printed before it are skipped), then send `sig`."""
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) and line.strip() != "paused":
        pass
    assert line, f"the run ended before its moment: {proc.communicate(timeout=60)}"
    proc.send_signal(sig)
    proc.wait(timeout=60)


def _export_argv(tiny: dict[str, Path], out: Path, *flags: str) -> list[str]:
    return ["export", str(tiny["ckpt"]), "--out", str(out), "--no-verify", *flags]


def _build_argv(tiny: dict[str, Path], out: Path) -> list[str]:
    return ["build", str(tiny["export"]), "--out", str(out), "--provider", "CPUExecutionProvider"]


def _run_to_the_end(tmp_path: Path, argv: list[str]) -> None:
    rerun = _cli(tmp_path, argv)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("verb", ["export", "build"])
@pytest.mark.parametrize("moment", [0, 1])
def test_a_real_run_stopped_by_sigterm_leaves_nothing(tiny: dict[str, Path], tmp_path: Path, verb: str,
                                                      moment: int) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    argv = _export_argv(tiny, out) if verb == "export" else _build_argv(tiny, out)
    proc = _cli(tmp_path, argv, *(EXPORT_MOMENTS if verb == "export" else BUILD_MOMENTS)[moment])
    _stop_when_paused(proc, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM
    assert sorted(p.name for p in work.iterdir()) == []  # neither --out nor a temporary


@pytest.mark.parametrize("moment", [0, 1])
def test_a_rebuild_stopped_by_sigterm_keeps_the_old_engine_whole(tiny: dict[str, Path], tmp_path: Path,
                                                                 moment: int) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    _run_to_the_end(tmp_path, _build_argv(tiny, out))
    before = _files(out)
    proc = _cli(tmp_path, _build_argv(tiny, out), *BUILD_MOMENTS[moment])
    _stop_when_paused(proc, signal.SIGTERM)
    assert sorted(p.name for p in work.iterdir()) == ["out"] and _files(out) == before


@pytest.mark.parametrize("moment", [0, 1])
def test_a_real_build_killed_by_sigkill_is_cleaned_by_the_next(tiny: dict[str, Path], tmp_path: Path,
                                                               moment: int) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    proc = _cli(tmp_path, _build_argv(tiny, out), *BUILD_MOMENTS[moment])
    _stop_when_paused(proc, signal.SIGKILL)
    debris = [p.name for p in work.iterdir()]
    assert len(debris) == 1 and debris[0].startswith(f".out.build-{proc.pid}-")  # --out never appeared
    _run_to_the_end(tmp_path, _build_argv(tiny, out))
    assert sorted(p.name for p in work.iterdir()) == ["out"] and (out / ".seer-deploy.json").is_file()


def test_real_exports_killed_by_sigkill_are_cleaned_by_the_next_run(tiny: dict[str, Path], tmp_path: Path) -> None:
    """Exports killed while tracing, before the rename, and (export --build) while the engine is built inside the
    export: each next run removes what the killed one left (the engine's temporary inside our export included)."""
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    plain, with_build = _export_argv(tiny, out), _export_argv(tiny, out, "--build", "ort")
    for argv, where, left in ((plain, EXPORT_MOMENTS[0], ".out.export-"), (plain, EXPORT_MOMENTS[1], ".out.export-"),
                              (with_build, ("seer_deploy.engines.build.install_dir", 1), "out")):
        proc = _cli(tmp_path, argv, *where)
        _stop_when_paused(proc, signal.SIGKILL)
        names = [p.name for p in work.iterdir()]
        assert len(names) == 1 and names[0].startswith(left), names  # the previous run's debris is gone
    debris = [p.name for p in out.iterdir() if p.name.startswith(".engine.")]
    assert len(debris) == 1 and debris[0].startswith(f".engine.build-{proc.pid}-")  # inside our export
    _run_to_the_end(tmp_path, with_build)
    assert [p.name for p in work.iterdir()] == ["out"] and not list(out.glob(".engine.*"))
    assert (out / "engine" / "engine.json").is_file()
