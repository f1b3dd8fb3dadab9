"""Loading an export costs what the run needs: `seer-deploy generate` on an export (ONNX Runtime) never imports torch
or transformers, `seer-deploy --help` imports no inference library, and the run reports its time to first step.

Each check runs the command line in a fresh interpreter, so nothing the test process imported hides an import."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.models.demos.demo_vl_tasks import heldout_examples as demo_vl_examples
from seer_deploy.service import Prompt, Service, ServiceOptions

# Runs the CLI as `seer-deploy ARGS` would, then prints, as the last line on stderr, which watched modules it loaded.
CLI_THEN_MODULES = """
import json, sys
from seer_deploy.cli import main
watched = sys.argv[1].split(",")
sys.argv = ["seer-deploy", *sys.argv[2:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"rc": code, "loaded": sorted(m for m in watched if m in sys.modules)}), file=sys.stderr)
"""


def run_cli(args: list[str], watched: tuple[str, ...]) -> tuple[int, str, list[str]]:
    """(exit code, stdout, the watched modules the run imported)."""
    done = subprocess.run([sys.executable, "-c", CLI_THEN_MODULES, ",".join(watched), *args], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr  # the interpreter itself; the CLI's exit code is in the report
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return int(report["rc"] or 0), done.stdout, report["loaded"]


@pytest.fixture(scope="module")
def demo_export(shared_demo_export: Callable[[str], Path]) -> Path:
    return shared_demo_export("demo")  # what `seer-deploy export demo` writes


def test_generate_on_an_export_imports_no_torch(demo_export: Path) -> None:
    code, stdout, loaded = run_cli(["generate", str(demo_export), "--prompt", "reverse 123", "--json"],
                                   ("torch", "transformers", "onnxruntime"))
    assert code == 0
    assert json.loads(stdout)["answer"] == "321"
    assert loaded == ["onnxruntime"]  # the engine it ran on, and nothing of torch's


# Runs the CLI with an audit hook that counts, by file name, every open of the files that describe a target.
CLI_THEN_OPENS = """
import collections, json, os, sys
opened = collections.Counter()
def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        name = os.path.basename(os.fsdecode(args[0]))
        if name in ("manifest.json", "config.json", "engine.json"):
            opened[name] += 1
sys.addaudithook(hook)
from seer_deploy.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"rc": code, "opened": opened}), file=sys.stderr)
"""


def test_generate_on_an_export_reads_its_manifest_once(demo_export: Path) -> None:
    """The target is described once (runtime.targets.describe): the Seer config's search, the opener, the backend
    and the tokenizer share the parsed manifest (six reads before issue 32); the demo's export names no config.json."""
    done = subprocess.run([sys.executable, "-c", CLI_THEN_OPENS, "generate", str(demo_export), "--prompt", "reverse 12",
                           "--json"], capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["rc"] in (0, None), done.stderr
    assert report["opened"] == {"manifest.json": 1}


def test_generate_on_a_multimodal_export_imports_no_torch(tmp_path: Path,
                                                          shared_demo_export: Callable[[str], Path]) -> None:
    picture = tmp_path / "picture.png"
    demo_vl_examples(1)[0].image().save(picture)
    code, stdout, loaded = run_cli(["generate", str(shared_demo_export("demo-vl")), "--image", str(picture), "--prompt",
                                    "<image> colors", "--json"], ("torch", "transformers"))
    assert code == 0 and json.loads(stdout)["answer"]
    assert loaded == []


def test_help_imports_no_inference_library() -> None:
    code, stdout, loaded = run_cli(["--help"], ("torch", "transformers", "onnxruntime", "onnx"))
    assert code == 0 and "generate" in stdout
    assert loaded == []


def test_generate_json_reports_time_to_first_step(demo_export: Path) -> None:
    """load_s then first_step_s, the same on every line of a run; the first step comes after the load."""
    args = ["generate", str(demo_export), "--prompt", "reverse 123", "--prompt", "sort 4321", "--json"]
    code, stdout, _ = run_cli(args, ())
    assert code == 0
    records = [json.loads(line) for line in stdout.splitlines()]
    assert len(records) == 2
    assert {(r["load_s"], r["first_step_s"]) for r in records} == {(records[0]["load_s"], records[0]["first_step_s"])}
    assert 0 < records[0]["load_s"] < records[0]["first_step_s"]


def test_service_times_the_first_batch_only(demo_export: Path) -> None:
    """first_step_seconds stops at the end of the first batch's step zero: a run of three one-request batches
    reports it before the run is over, and its load is the service's own."""
    requests = [Prompt(e.prompt) for e in heldout_examples(3)]
    opened = time.perf_counter()
    service = Service(demo_export, ServiceOptions(batch_size=1))
    called = time.perf_counter()
    run = service.generate(requests)
    finished = time.perf_counter()
    assert run.load_seconds == service.load_seconds
    assert 0 < run.load_seconds <= called - opened
    assert run.load_seconds < run.first_step_seconds < run.load_seconds + (finished - called)
    assert run.first_step_seconds < run.load_seconds + run.seconds  # not the whole run: its first step
