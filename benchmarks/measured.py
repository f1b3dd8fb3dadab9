"""Run a command as one process and measure it: wall time, peak resident memory (the kernel's high-water mark) and
output. Shared by the benchmark scripts (benchmarks/scale_export.py, benchmarks/llama_cpp/compare.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PY = sys.executable


@dataclass
class Proc:
    rc: int
    wall_s: float
    peak_rss: int  # bytes, the process's high-water mark (wait4 ru_maxrss)
    out: str
    err: str
    spawn: float  # time.time() just before the process was forked


# Peak RSS needs a small parent: Linux carries the memory high-water mark of the process that forks (or vforks) into
# the child's ru_maxrss across exec, so a child spawned straight from this script (torch imported, checkpoint written)
# would report at least this script's peak. This launcher, a bare interpreter, forks the measured command itself and
# reports its child's ru_maxrss and the time just before the fork.
RSS_LAUNCHER = """
import os, sys, time
start = time.time()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{usage.ru_maxrss} {start!r}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Proc:
    """Run `cmd` as one process (through RSS_LAUNCHER): its wall time, peak RSS and output."""
    import tempfile

    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f, \
            tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_f:
        p = subprocess.Popen([PY, "-S", "-c", RSS_LAUNCHER, rss_f.name, *cmd], stdout=out_f, stderr=err_f, env=env,
                             cwd=cwd)
        rc = p.wait()
        end = time.time()
        rss_kib, spawn = rss_f.read().split()
        out_f.seek(0)
        err_f.seek(0)
        return Proc(rc, end - float(spawn), int(rss_kib) * 1024, out_f.read().decode(errors="replace"),
                    err_f.read().decode(errors="replace"), float(spawn))
