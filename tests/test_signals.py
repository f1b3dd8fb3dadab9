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
