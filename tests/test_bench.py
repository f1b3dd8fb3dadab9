"""`seer-deploy bench` on a tiny random checkpoint: the files it writes and their fields (never the speeds), the
oracle row's semantics, and bad arguments."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_model

from seer_deploy.bench.report import render_markdown
from seer_deploy.bench.results import load_json
from seer_deploy.bench.rows import oracle_row
from seer_deploy.cli import main
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.demos.demo_tasks import heldout_examples
from seer_deploy.runtime.loop import run_generation
from seer_deploy.service import Prompt, SeerOptions, Service, ServiceOptions

ROWS = ("reference", "ort-full", "ort-parallel", "ort-fastdllm", "ort-seer", "ort-seer-fast", "ort-seer-progressive",
        "ort-oracle", "torch-seer")
QUANTIZED_ROWS = ("ort-int8-seer", "ort-int8-seer-fast", "ort-int4-seer", "ort-int4-seer-fast")  # bench's default
SEER_ROWS = ("ort-seer", "ort-seer-tail", "ort-seer-fast", "ort-seer-progressive", "ort-oracle", "torch-seer",
             *QUANTIZED_ROWS)  # rows that report kept lengths
WITH_TAIL = (*ROWS, "ort-seer-tail", *QUANTIZED_ROWS)  # rows of a run with --tail-context (and the default --quantize)


def _bench(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    return int(exc.value.code or 0)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One tiny bench run shared by the file tests: (checkpoint, out dir)."""
    from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
    from seer_deploy.models.demos.demo_tasks import write_tokenizer


    root = tmp_path_factory.mktemp("bench")
    write_tokenizer(root / "tokenizer.json")
    ckpt = save_checkpoint(tiny_model(), root / "ckpt", tokenizer_file=root / "tokenizer.json")
    out = root / "out"
    rc = _bench([str(ckpt), "--gen-lengths", "8,16", "--batch-sizes", "1,2", "--prompts", "2", "--repeats", "2",
                 "--out", str(out), "--scaling-lengths", "8,16", "--scaling-shape", "32,1,64,64", "--no-tensorrt",
                 "--tail-context", "all", "--fast-block-length", "4", "--threshold", "0.5", "--first-canvas", "4",
                 "--device", "cpu", "--io-binding"])
    assert rc == 0
    return ckpt, out


def test_writes_json_markdown_and_png(bench_run: tuple[Path, Path]) -> None:
    _, out = bench_run
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.md", "bench.png"]  # no temp files left
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = load_json(out / "bench.json")
    machine = data["machine"]
    assert machine["cpu"] and machine["logical_cores"] >= 1 and machine["usable_cores"] >= 1
    assert {"torch", "onnxruntime", "onnx", "numpy", "seer_deploy"} <= set(machine["versions"])
    assert data["settings"]["gen_lengths"] == [8, 16] and data["settings"]["batch_sizes"] == [1, 2]
    assert "--gen-lengths 8,16" in data["command"] and "--no-tensorrt" in data["command"]
    assert "--tail-context all" in data["command"] and data["settings"]["tail_context"] == "all"
    assert ("--fast-block-length 4 --threshold 0.5 --first-canvas 4 --device cpu --io-binding --quantize int8,int4"
            in data["command"])
    assert data["settings"]["fast_rows"]["block_length"] == 4 and data["settings"]["fast_rows"]["threshold"] == 0.5
    assert {s["row"] for s in data["skipped"]} == {"trt-full", "trt-seer"}
    assert data["seer"]["source"] == "defaults" and data["notes"]  # the tiny checkpoint has no calibration
    assert data["seer"]["tail_context"] == 0 and "tail context 0 (ort-seer-tail: all)" in (out / "bench.md").read_text()
    assert "| first step ms |" in (out / "bench.md").read_text()
    # The markdown is a rendering of the JSON alone.
    assert (out / "bench.md").read_text() == render_markdown(json.loads((out / "bench.json").read_text()), "bench.png")


def test_every_setting_has_every_row_with_its_fields(bench_run: tuple[Path, Path]) -> None:
    _, out = bench_run
    data = load_json(out / "bench.json")
    rows = data["rows"]
    keys = {(r["gen_length"], r["batch_size"], r["row"]) for r in rows}
    assert keys == {(g, b, name) for g in (8, 16) for b in (1, 2) for name in WITH_TAIL}
    assert len(rows) == len(keys)
    for r in rows:
        assert len(r["seconds_runs"]) == 2 and r["seconds"] > 0
        assert 0 < r["latency_p50_s"] <= r["latency_p95_s"]
        assert 0 <= r["exact_match"] <= 1 and 0 <= r["identical_to_full"] <= 1
        assert r["tokens_per_s"] == pytest.approx(r["answer_tokens"] / r["seconds"], rel=1e-2, abs=0.01)
        assert (r["seer_over_oracle"] is not None) == (r["row"] in ("ort-seer", "ort-seer-tail"))
        assert (r["mean_kept"] is not None) == (r["row"] in SEER_ROWS)
        assert (r["step_zero_share"] is None) == (r["row"] == "reference")
        # Time to first step: rows through the service (not the torch loop itself, nor the oracle, which has no
        # step zero), after their engine's load.
        assert (r["first_step_s"] is None) == (r["row"] in ("reference", "ort-oracle"))
        if r["first_step_s"] is not None:
            engine = "torch" if r["row"].startswith("torch") else "-".join(r["row"].split("-")[:2]) if r[
                "row"] in QUANTIZED_ROWS else "ort"
            assert 0 < data["model"]["load_s"][engine] < r["first_step_s"]
        if r["answer_tokens"]:
            assert r["tokens_per_answer_token"] == pytest.approx(r["tokens_processed"] / r["answer_tokens"], abs=0.01)
        if r["row"] in ("ort-parallel", "ort-fastdllm"):
            # The threshold rule: at least a pass per block of 4 and batch, at most one per slot.
            n_batches = -(-2 // r["batch_size"])
            assert r["gen_length"] // 4 * n_batches <= r["forward_passes"] <= r["gen_length"] * n_batches
        if r["row"] == "reference":
            assert r["speedup"] == 1.0 and r["identical_to_full"] == 1.0
            # steps = gen_length, one block: gen_length passes per batch, every one at full length.
            n_batches = -(-2 // r["batch_size"])
            assert r["forward_passes"] == r["gen_length"] * n_batches
        if r["row"] == "ort-oracle":
            assert r["safe"] == 1.0
    # ort-seer-tail: Seer's cut and steps (alone in a batch, the same passes), the whole cut tail still in view.
    for g in (8, 16):
        row = {r["row"]: r for r in rows if (r["gen_length"], r["batch_size"]) == (g, 1)}
        seer, tail = row["ort-seer"], row["ort-seer-tail"]
        assert (tail["mean_kept"], tail["forward_passes"]) == (seer["mean_kept"], seer["forward_passes"])
        assert seer["tokens_processed"] <= tail["tokens_processed"] <= row["ort-full"]["tokens_processed"]
        if seer["mean_kept"] < g:  # something was cut: its slots ran as context
            assert tail["tokens_processed"] > seer["tokens_processed"]


def test_oracle_never_runs_a_full_length_step(bench_run: tuple[Path, Path]) -> None:
    """At batch 1 the oracle makes one pass per kept slot (one token a step) and no step zero at full length,
    while Seer makes that extra pass."""
    _, out = bench_run
    data = load_json(out / "bench.json")
    for g in (8, 16):
        row = {r["row"]: r for r in data["rows"] if (r["gen_length"], r["batch_size"]) == (g, 1)}
        oracle, full = row["ort-oracle"], row["ort-full"]
        assert oracle["forward_passes"] == round(oracle["mean_kept"] * 2)
        assert oracle["forward_passes"] <= full["forward_passes"] == 2 * g
        assert oracle["tokens_processed"] <= full["tokens_processed"]


def test_oracle_rows_match_runs_at_their_true_length(make_checkpoint: Callable[..., Path]) -> None:
    """Each oracle row gives the tokens of a run whose gen_length is its true length, padded with EOS."""
    service = Service(make_checkpoint(), ServiceOptions(seer=SeerOptions(on=False)))
    backend, info = service.backend, service.info
    requests = [Prompt(e.prompt) for e in heldout_examples(3)]
    G, lengths = 16, [5, 16, 1]
    prompts = service.prompt_ids(requests, GenerationConfig(G, G))
    out = oracle_row(service, GenerationConfig(G, G), lengths)(requests, [0, 1, 2])
    assert out.kept == lengths
    assert out.forward_passes <= sum(lengths)  # rows share passes when the scheduler groups them
    for b, n in enumerate(lengths):
        solo = run_generation(backend, [prompts[b]], GenerationConfig(n, n), ids=SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id))
        np.testing.assert_array_equal(out.tokens[b, :n], solo.tokens[0])
        assert np.all(out.tokens[b, n:] == info.eos_id)
    alone = oracle_row(service, GenerationConfig(G, G), [5])(requests[:1], [0])
    assert alone.forward_passes == 5
    assert alone.tokens_processed == 5 * (len(prompts[0]) + 5)  # no pass at prompt + gen_length


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gen-lengths", "8,x"], "--gen-lengths"),
        (["--batch-sizes", "0"], "--batch-sizes"),
        (["--prompts", "0"], "--prompts"),
        (["--gen-lengths", "8", "--scaling", "--scaling-shape", "32,1,64"], "--scaling-shape"),
        (["--gen-lengths", "8", "--device", "tpu"], "--device 'tpu' is not a device"),
        (["--gen-lengths", "4096"], "exceeds the model's"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(
    make_checkpoint: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
    message: str,
) -> None:
    rc = _bench([str(make_checkpoint()), "--out", str(tmp_path / "out"), "--no-scaling", *args])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_multimodal_target_benches_pictures_with_its_own_default_lengths(tmp_path: Path) -> None:
    """A LLaDA-V-layout checkpoint gets the demo-vl workload: every row on held-out pictures, the vision tower in the
    model section, gen lengths 16/32/64 by default, and ONNX Runtime's answers equal to the torch reference's."""
    from test_multimodal import write_tiny_vl

    ckpt, _, _ = write_tiny_vl(tmp_path / "tiny-vl")
    out = tmp_path / "out"
    assert _bench([str(ckpt), "--batch-sizes", "1,2", "--prompts", "2", "--repeats", "1", "--out", str(out),
                   "--no-scaling", "--no-tensorrt", "--quantize", "none"]) == 0
    data = load_json(out / "bench.json")
    assert data["settings"]["gen_lengths"] == [16, 32, 64]
    assert "demo-vl pictures" in data["settings"]["workload"]
    assert data["model"]["vision_parameters"] > 0 and data["model"]["tokens_per_image"] > 0
    keys = {(r["gen_length"], r["batch_size"], r["row"]) for r in data["rows"]}
    assert keys == {(g, b, name) for g in (16, 32, 64) for b in (1, 2) for name in ROWS}
    for r in data["rows"]:
        if r["row"] == "ort-full":
            assert r["identical_to_full"] == 1.0 and r["forward_passes"] == r["gen_length"] * -(-2 // r["batch_size"])
    markdown = (out / "bench.md").read_text()
    assert "vision tower" in markdown and "demo-vl pictures" in markdown


def test_multimodal_bench_names_the_length_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_multimodal import write_tiny_vl

    ckpt, _, _ = write_tiny_vl(tmp_path / "tiny-vl")
    rc = _bench([str(ckpt), "--gen-lengths", "128", "--out", str(tmp_path / "out"), "--no-scaling"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "image tokens" in err and "exceeds the model's 96 positions" in err
    assert not (tmp_path / "out").exists()
