"""The quantized export's check, measured (issue 47): its figures on honest int8 / int4 exports (the demo, demo-vl,
the tiny family checkpoints of tests/public_facts.py, the flat and peaked random models of tests/faults.py) and on
the issue's noise graph (every projection and the LM head replaced by unrelated noise before quantizing), each with
the verdict. README's "Smaller weights" table quotes them.

    PYTHONPATH=. python benchmarks/export_check.py --out benchmarks/results-export-check/figures.json

The JSON holds the commit, the date, the machine and, per export, the manifest's validation record.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from faults import inject, random_checkpoint
from test_families_text import family_checkpoint

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.quantization import Quantization
from seer_deploy.core.errors import UnverifiedExport
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.export.options import ExportOptions

FAMILIES = ("llada", "dream", "llada_moe", "mmada", "dimple")
NOISE = "every projection and the LM head"


def options(scheme: str, form: str, block_size: int = 32) -> ExportOptions:
    quant = Quantization(scheme, block_size=block_size, format=form)
    return ExportOptions(opset=21, quantization=quant) if form == "qdq" else ExportOptions(quantization=quant)


def measured(source: str | Path, out: Path, export_options: ExportOptions, noisy: bool) -> dict[str, object]:
    """Run one export (with `noisy`, its weights replaced by noise as they are written); its manifest's validation
    record (kept when refused)."""
    patch = pytest.MonkeyPatch()
    try:
        if noisy:
            inject(patch, Path(source), NOISE)
        if source == "demo-vl":
            export_multimodal(source, out, export_options)
        else:
            export_checkpoint(source, out, export_options)
    except UnverifiedExport:
        pass
    finally:
        patch.undo()
    return ExportManifest.load(out).extra["validation"]  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                            check=True).stdout.strip()
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shapes = {shape: random_checkpoint(root / "models", peaked=shape == "peaked") for shape in ("flat", "peaked")}
        families = {family: family_checkpoint(root / family, family, layout="llada" if family == "llada" else "llama")[1]
                    for family in FAMILIES}
        cases: list[tuple[str, str | Path, ExportOptions, bool]] = []
        for shape, checkpoint in shapes.items():  # the acceptance first: the noise graph in every form
            for scheme in ("int8", "int4"):
                for form in ("nbits", "qdq"):
                    cases.append((f"{shape} {scheme} {form}, {NOISE} replaced by noise", checkpoint,
                                  options(scheme, form), True))
        for scheme in ("int8", "int4"):
            cases += [(f"demo {scheme} nbits", "demo", options(scheme, "nbits"), False),
                      *((f"{shape} {scheme} nbits", checkpoint, options(scheme, "nbits"), False)
                        for shape, checkpoint in shapes.items()),
                      (f"demo-vl {scheme} nbits", "demo-vl", options(scheme, "nbits"), False),
                      *((f"{family} {scheme} nbits (blocks of 16)", checkpoint, options(scheme, "nbits", 16), False)
                        for family, checkpoint in families.items())]
        for index, (label, source, export_options, noisy) in enumerate(cases):
            out = root / label.replace(" ", "_").replace(",", "")
            started = time.perf_counter()
            record = measured(source, out, export_options, noisy)
            runs.append({"export": label, "seconds": round(time.perf_counter() - started, 1), **record})
            print(label, "verified" if record["verified"] else "REFUSED", flush=True)
            _write(args.out, commit, runs, complete=index == len(cases) - 1)  # after each: a long run keeps its part


def _write(out: Path, commit: str, runs: list[dict[str, object]], complete: bool) -> None:
    result = {"commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{platform.processor() or platform.machine()}, other sessions were running",
              "command": f"PYTHONPATH=. python benchmarks/export_check.py --out {out}", "complete": complete,
              "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
