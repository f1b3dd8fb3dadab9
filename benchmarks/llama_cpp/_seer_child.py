"""Run the `seer-deploy` CLI with every ONNX Runtime call timed (used by compare.py; not a public entry point).

`python _seer_child.py TRACE.json generate EXPORT_DIR ...` runs `seer-deploy generate EXPORT_DIR ...` unchanged, and
at exit writes to TRACE.json the wall-clock start and end (time.time()) of every `InferenceSession.run` /
`run_with_iobinding` call. compare.py takes the time to the first step from the first call's start and the step time
from the span of all calls, whatever the working tree's loop does around them (lazy sessions, fewer graphs, timing
fields in --json or not). Only onnxruntime is imported before the CLI: nothing here adds to the run path.
"""

from __future__ import annotations

import atexit
import json
import sys
import time

TRACE: dict[str, object] = {"process_start": time.time(), "calls": []}


def _timed(fn):  # type: ignore[no-untyped-def]
    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.time()
        try:
            return fn(self, *args, **kwargs)
        finally:
            TRACE["calls"].append((start, time.time()))  # type: ignore[union-attr]

    return run


def _write(path: str) -> None:
    with open(path, "w") as f:
        json.dump(TRACE, f)


def main() -> None:
    trace_path, cli_args = sys.argv[1], sys.argv[2:]
    import onnxruntime as ort

    for name in ("run", "run_with_iobinding"):
        if hasattr(ort.InferenceSession, name):
            setattr(ort.InferenceSession, name, _timed(getattr(ort.InferenceSession, name)))
    atexit.register(_write, trace_path)
    from seer_deploy.cli import main as cli_main

    sys.argv = ["seer-deploy", *cli_args]
    cli_main()


if __name__ == "__main__":
    main()
