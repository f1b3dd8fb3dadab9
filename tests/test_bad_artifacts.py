"""Bad inputs around exports and engines, through the real command line: --out directories that are not ours
(never deleted, --force or not), manifests and engine.json files that are damaged or name paths outside their
directory, damaged graphs, and flags that must be refused before any export or build starts. The same promises as
tests/test_bad_inputs.py (tests/bad_input_world.py). A case that waits for a fix is a strict xfail naming who
makes it (Case.wired_by), so it flips when that lands."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bad_input_world import Case, Setup, World, argv, assert_one_line_error, check_case, edit_json, params, run_cli
from conftest import tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny checkpoint, its export (no torch comparison) and an ONNX Runtime engine built from it."""
    from seer_deploy.cli import main

    root = tmp_path_factory.mktemp("sources")
    write_tokenizer(root / "tokenizer.json")
    save_checkpoint(tiny_model(), root / "ckpt", tokenizer_file=root / "tokenizer.json")
    save_checkpoint(tiny_model(seed=5), root / "other", tokenizer_file=root / "tokenizer.json")
    for command in (["export", str(root / "ckpt"), "--out", str(root / "export"), "--no-verify"],
                    ["build", str(root / "export"), "--out", str(root / "engine")]):
        with pytest.raises(SystemExit) as done:
            main(command)
        assert done.value.code in (0, None), command
    return {name: root / name for name in ("ckpt", "other", "export", "engine")}


def out_dir(files: dict[str, str]) -> Callable[[World], Path]:
    """A directory `out` holding `files` (name -> text)."""

    def make(w: World) -> Path:
        out = w.root / "out"
        out.mkdir()
        for name, text in files.items():
            (out / name).write_text(text)
        return out

    return make


def build_into(make_out: Callable[[World], Path], *flags: str) -> Setup:
    return lambda w: ["build", str(w.copy("export")), "--out", str(make_out(w)), *flags]


def export_into(make_out: Callable[[World], Path], *flags: str, source: str = "ckpt") -> Setup:
    return lambda w: ["export", str(w.copy(source)), "--out", str(make_out(w)), "--no-verify", *flags]


def fresh_out(w: World) -> Path:
    return w.root / "new-out"


def an_out_file(w: World) -> Path:
    (w.root / "out").write_text("not a directory")
    return w.root / "out"


def our_export_of_another_model(w: World) -> Path:
    return w.copy("export", "out")  # the tiny export, while --out is asked for 'other'


def our_engine_of_another_model(w: World) -> Path:
    """A copy of the tiny engine whose ownership marker says it was built for another model."""
    out = w.copy("engine", "out")
    edit_json(out / ".seer-deploy.json", {"fingerprint": "0" * 64})
    return out


def a_link_to_a_directory(w: World) -> Path:
    (w.root / "real").mkdir()
    (w.root / "out").symlink_to(w.root / "real")
    return w.root / "out"


def demo_into(files: dict[str, str]) -> Setup:
    """`demo --work-dir W` where W/export already holds `files`."""

    def setup(w: World) -> list[str]:
        export = w.root / "work" / "export"
        export.mkdir(parents=True)
        for name, text in files.items():
            (export / name).write_text(text)
        return ["demo", "--work-dir", str(w.root / "work"), "--repeats", "1"]

    return setup


def artifact(source: str, file: str, changes: dict[str, Any] | None = None, raw: bytes | None = None,
             before: Callable[[World, Path], object] | None = None) -> Setup:
    """`generate DIR` on a copy of the export or engine `source` after changing its `file` (dotted keys), replacing
    it with `raw` bytes, or calling before(world, dir)."""

    def setup(w: World) -> list[str]:
        directory = w.copy(source)
        if before is not None:
            before(w, directory)
        if raw is not None:
            (directory / file).write_bytes(raw)
        elif changes:
            edit_json(directory / file, changes)
        return ["generate", str(directory), "-p", "reverse 1", "--gen-length", "4"]

    return setup


def manifest(changes: dict[str, Any] | None = None, raw: bytes | None = None,
             before: Callable[[World, Path], object] | None = None) -> Setup:
    return artifact("export", "manifest.json", changes, raw, before)


def engine(changes: dict[str, Any] | None = None, raw: bytes | None = None) -> Setup:
    return artifact("engine", "engine.json", changes, raw)


def rehash(graph: str) -> Callable[[World, Path], None]:
    """Record the graph file's current sha256 in the manifest (as if the export had written it so)."""

    def fix(w: World, export: Path) -> None:
        digest = hashlib.sha256((export / f"{graph}.onnx").read_bytes()).hexdigest()
        edit_json(export / "manifest.json", {f"graphs.{graph}.sha256": digest})

    return fix


def truncated_graph(w: World, export: Path) -> None:
    graph = export / "step.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    rehash("step")(w, export)


def external_data_outside(w: World, export: Path) -> None:
    """step.onnx's weights read from ../outside/canary.bin (a valid copy of weights.bin), hash updated."""
    import onnx

    graph = export / "step.onnx"
    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../outside/canary.bin"
    onnx.save(model, str(graph))
    rehash("step")(w, export)


def graph_link_outside(w: World, export: Path) -> None:
    (export / "step-link.onnx").symlink_to(w.outside / "canary.onnx")
    edit_json(export / "manifest.json", {"graphs.step.file": "step-link.onnx",
                                         "graphs.step.sha256": hashlib.sha256((w.outside / "canary.onnx")
                                                                               .read_bytes()).hexdigest()})


OUT_CASES = [
    Case("build-out-foreign-engine-json", build_into(out_dir({"engine.json": "{}", "thesis.tex": "years"})),
         r"did not write \(engine.json, thesis.tex\)"),
    Case("build-out-only-engine-json", build_into(out_dir({"engine.json": "{}"})), r"did not write \(engine.json\)"),
    Case("build-out-foreign", build_into(out_dir({"notes.txt": "mine"})), "notes.txt"),
    Case("build-out-a-file", build_into(an_out_file), "is a file"),
    Case("export-force-foreign-manifest", export_into(out_dir({"manifest.json": '{"mine": 1}', "data.csv": "1,2"}),
                                                      "--force"), r"did not write \(data.csv, manifest.json\)"),
    Case("export-foreign-manifest", export_into(out_dir({"manifest.json": '{"mine": 1}'})), "manifest.json"),
    Case("export-out-foreign", export_into(out_dir({"notes.txt": "mine"})), "notes.txt"),
    Case("build-force-foreign-engine-json", build_into(out_dir({"engine.json": "{}", "thesis.tex": "years"}),
                                                       "--force"), r"did not write \(engine.json, thesis.tex\)"),
    Case("build-another-models-engine", build_into(our_engine_of_another_model), "another model.*--force"),
    Case("build-into-its-export", lambda w: ["build", str(w.copy("export")), "--out", str(w.copy("export"))],
         "'export' artifact, not an 'engine'"),
    Case("build-out-a-link", build_into(a_link_to_a_directory), "symbolic link"),
    Case("export-into-an-engine", export_into(lambda w: w.copy("engine", "out")), "'engine' artifact, not an 'export'"),
    Case("export-out-a-file", export_into(an_out_file), "is a file"),
    Case("export-another-model", export_into(our_export_of_another_model, source="other"),
         "another model.*--force"),
    Case("export-opset-5", export_into(fresh_out, "--opset", "5"), "opset"),
    Case("export-max-seq-len-1", export_into(fresh_out, "--max-seq-len", "1"), "max.seq.len"),
    Case("export-max-seq-len-huge", export_into(fresh_out, "--max-seq-len", "100000"), "max.seq.len"),
    Case("export-bf16", export_into(fresh_out, "--dtype", "bf16"), "bf16"),
    Case("export-missing-checkpoint", argv("export", "{root}/nowhere", "--out", "{root}/x"), "does not exist"),
    Case("export-seer-threshold-rejected", lambda w: ((w.root / "seer.json").write_text('{"abs_threshold": -1}'),
                                                      export_into(fresh_out, "--seer-config",
                                                                  str(w.root / "seer.json"))(w))[1],
         "abs_threshold"),
    Case("build-max-batch-0", build_into(fresh_out, "--max-batch", "0"), "max.batch"),
    Case("build-buckets-word", build_into(fresh_out, "--buckets", "16,big"), "bucket"),
    Case("build-buckets-0", build_into(fresh_out, "--buckets", "0,16"), "bucket"),
    Case("build-min-prompt-0", build_into(fresh_out, "--min-prompt", "0"), "prompt"),
    Case("build-threads-negative", build_into(fresh_out, "--threads", "-2"), "threads"),
    Case("build-workspace-word", build_into(fresh_out, "--workspace", "lots"), "'lots'"),
    Case("build-export-missing", argv("build", "{root}/nowhere", "--out", "{root}/x"), "nowhere"),
    Case("demo-work-dir-not-ours", demo_into({"manifest.json": "{}", "notes.txt": "mine"}), "notes.txt"),
    Case("demo-threads-negative", argv("demo", "--threads", "-1", "--work-dir", "{root}/demo"), "threads"),
    Case("demo-gen-length-0", argv("demo", "--gen-length", "0", "--work-dir", "{root}/demo"), "gen.length"),
    Case("demo-repeats-0", argv("demo", "--repeats", "0", "--work-dir", "{root}/demo"), "repeats"),
    Case("calibrate-gen-length-0", lambda w: ((w.root / "p.txt").write_text("reverse 1\n"),
                                              ["calibrate", "demo", "--prompts", str(w.root / "p.txt"), "--out",
                                               str(w.root / "seer.json"), "--gen-length", "0"])[1], "gen.length"),
    Case("inspect-steps-0", argv("inspect", "demo", "-p", "reverse 1", "--out", "{root}/p.png", "--steps", "0"),
         "steps is 0"),
]

MANIFEST_CASES = [
    Case("graph-parent", manifest({"graphs.step.file": "../outside/canary.onnx"}), "outside"),
    Case("graph-absolute", lambda w: manifest({"graphs.step.file": str(w.outside / "canary.onnx")})(w),
         "absolute path"),
    Case("graph-symlink-out", manifest(before=graph_link_outside), "outside"),
    Case("weights-parent", manifest({"weights.file": "../outside/canary.bin"}), "outside"),
    Case("graph-external-data-out", manifest(before=external_data_outside), "outside"),
    Case("graph-truncated", manifest(before=truncated_graph), "step.onnx", heavy_ok=True),
    Case("graph-modified", manifest(before=lambda w, e: (e / "step.onnx").write_bytes(b"\x08\x07")), "sha256"),
    Case("manifest-not-utf8", manifest(raw=b'{"format": "\xff"}'), r"manifest.json is not (UTF-8|valid JSON)"),
    Case("manifest-not-json", manifest(raw=b"{format"), "manifest.json"),
    Case("manifest-array", manifest(raw=b"[]"), "manifest.json"),
    Case("manifest-old-version", manifest({"format_version": 1}), "older seer-deploy"),
    Case("manifest-n-heads-0", manifest({"model.config.n_heads": 0}), "'n_heads' is 0"),
    Case("manifest-mask-beyond-vocab", manifest({"special_ids.mask": 1000}), "mask"),
    Case("manifest-max-seq-len-negative", manifest({"max_seq_len": -1}), "max_seq_len"),
    Case("manifest-dtype", manifest({"dtype": "int4"}), "dtype"),
    Case("manifest-eos-negative", manifest({"special_ids.eos": -3}), "eos"),
    Case("manifest-max-seq-len-past-the-model", manifest({"max_seq_len": 10**6}), "max_seq_len"),
    Case("manifest-stats-layer-missing", manifest({"seer.stats_layers": [7]}), "stats_layers"),
    Case("manifest-sparsity-row-a-string", manifest({"seer.sparsity_rows": ["12"]}), "sparsity_rows"),
    Case("manifest-shape-null", manifest({"graphs.step.inputs.input_ids.shape": [None, "seq"]}), "shape"),
    Case("manifest-extra-a-string", manifest({"extra": "ab"}), "'extra' must be an object"),
    Case("manifest-threshold-0", manifest({"seer.rel_threshold": 0}), "rel_threshold"),
    Case("engine-not-utf8", engine(raw=b'{"backend": "\xff"}'), r"engine.json is not (UTF-8|valid JSON)"),
    Case("engine-not-json", engine(raw=b"{backend"), "engine.json"),
    Case("engine-other-model", engine({"model_fingerprint": "0" * 64}), "built for model"),
    Case("engine-graph-hash", engine({"graph_hashes.step": "0" * 64}), "step"),
    Case("engine-buckets-0", engine({"buckets": [0, 16]}), "bucket"),
    Case("engine-file-parent", engine({"files.step": "../outside/canary.onnx"}), "outside"),
    Case("engine-backend", engine({"backend": "cuda"}), "backend"),
    Case("engine-max-batch-a-string", engine({"max_batch": "8"}), "'max_batch' must be an integer, got '8'"),
    Case("engine-buckets-fractions", engine({"buckets": [16.5, 32]}), "'buckets' is .* a list of integers"),
    Case("engine-threads-a-string", engine({"ort_session.intra_op_threads": "2"}),
         "'ort_session.intra_op_threads' must be an integer"),
]

ALL_CASES = OUT_CASES + MANIFEST_CASES


@pytest.mark.parametrize("case", params(ALL_CASES))
def test_bad_artifact_input(case: Case, tmp_path: Path, sources: dict[str, Path],
                            capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    check_case(case, World(tmp_path, sources), capsys, monkeypatch)


MANIFEST_LEAVES = ["format_version", "model.layout", "model.config.d_model", "model.config.vocab_size",
                   "model.config.mask_id", "special_ids.mask", "special_ids.eos", "dtype", "opset", "max_seq_len",
                   "graphs.step.file", "graphs.step.inputs", "seer.stats_layers", "seer.abs_threshold",
                   "weights.file", "weights.bytes", "sampling"]
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 300), st.integers(-(2**62), 2**62),
                        st.floats(allow_nan=False), st.text(max_size=6), st.lists(st.integers(0, 3), max_size=2),
                        st.just("step.onnx"), st.just({}))  # paths outside: the confinement cases above


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(MANIFEST_LEAVES), JSON_VALUES, min_size=1, max_size=2))
def test_generated_manifests_load_or_fail_in_one_line(sources: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                      changes: dict[str, Any]) -> None:
    os.environ.pop("SEER_DEPLOY_DEBUG", None)
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp), sources)
        export = world.copy("export")
        edit_json(export / "manifest.json", changes)
        code, _, err = run_cli(["generate", str(export), "-p", "reverse 1", "--gen-length", "4"], capsys)
    if code != 0:
        assert_one_line_error(code, err)


def test_an_export_killed_by_sigterm_leaves_nothing(sources: dict[str, Path], tmp_path: Path) -> None:
    """The real CLI, stopped while it exports: the temporary directory beside --out goes, --out never appears."""
    out = tmp_path / "export"
    proc = subprocess.Popen([sys.executable, "-c", "from seer_deploy.cli import main; main()", "export",
                             str(sources["ckpt"]), "--out", str(out), "--no-verify"],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".export.export-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".export.export-*")), "the export never started its temporary directory"
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
