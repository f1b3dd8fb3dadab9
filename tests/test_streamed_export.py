"""The streamed export (issue 34): graphs traced on a fake model whose weights are written from the checkpoint tensor
by tensor, and a torch reference computed one layer at a time, give what tracing the loaded model gives; and the
export's memory stays near the weights, measured in a subprocess.

Two random models in LLaDA's layout, bf16 shards: a small one (8M parameters) for the equalities, and a wide shallow
one (250M parameters, 480 MiB in float16, nearly all in its two layers as in an 8B model; shallow, so that tracing
stays quick) for the memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import tiny_model

from seer_deploy.contracts.graph_calls import scoring_feed
from seer_deploy.contracts.graphs import Size, step_graph
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.export import resources
from seer_deploy.export.exporter import (
    STAGES,
    GraphPlan,
    cache_sizes,
    export_checkpoint,
    quiet,
    step_examples,
    trace_graphs,
)
from seer_deploy.export.graphs import step_module
from seer_deploy.export.options import ExportOptions
from seer_deploy.export.resources import footprint
from seer_deploy.export.streamed_reference import streamed_references
from seer_deploy.export.validate import make_probes, torch_references
from seer_deploy.models.checkpoints.checkpoint import checkpoint_weights, load_checkpoint, save_checkpoint
from seer_deploy.models.checkpoints.weight_sources import weight_sources
from seer_deploy.models.demos.demo_tasks import write_tokenizer

SIZE = {"d_model": 384, "n_layers": 4, "n_heads": 6, "n_kv_heads": 6, "mlp_hidden": 1024, "vocab_size": 4096,
        "max_seq_len": 64}
WIDE = {"d_model": 3072, "n_layers": 2, "n_heads": 24, "n_kv_heads": 24, "mlp_hidden": 8192, "vocab_size": 4096,
        "max_seq_len": 64}
MiB = 2**20

# Exports in a fresh interpreter and prints its memory before the export (libraries imported) and its high-water mark.
MEASURE = """
import json, sys
import onnxruntime, torch, onnx  # the libraries an export loads, before the baseline is taken
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions

def memory(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

before = memory("VmHWM")
result = export_checkpoint(sys.argv[1], sys.argv[2], ExportOptions(dtype="fp16", verify=sys.argv[3] == "True"))
print(json.dumps({"before": before, "peak": memory("VmHWM"), "weights": result.manifest.weights.bytes}))
"""


def random_checkpoint(root: Path, size: dict[str, int], shard_bytes: int) -> Path:
    write_tokenizer(root / "tokenizer.json")
    model = tiny_model(0, **size)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)  # LLaDA-like scales: float16 activations stay in range
    return save_checkpoint(model, root / "ckpt", "llada", dtype=torch.bfloat16, max_shard_bytes=shard_bytes,
                           tokenizer_file=root / "tokenizer.json")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_checkpoint(tmp_path_factory.mktemp("streamed"), SIZE, 4 * MiB)


@pytest.fixture(scope="module")
def streamed(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_checkpoint(checkpoint, tmp_path_factory.mktemp("out") / "export", ExportOptions(dtype="fp16")).out


def loaded_trace(checkpoint: Path, tmp: Path) -> Path:
    """The step graph traced the way a loaded model is: real float16 weights, the exporter's optimizer folding them."""
    ckpt = load_checkpoint(checkpoint, dtype=torch.float16)
    options = ExportOptions(dtype="fp16")
    stats = StatsSpec.from_config(None, ckpt.config.n_layers)
    plan = GraphPlan(modules=((step_graph(), step_module(ckpt.model, stats)),),
                     examples=step_examples(ckpt.config, SIZE["max_seq_len"]),
                     sizes={Size.STAT_ROWS: len(stats.sparsity_rows), **cache_sizes(ckpt.config)},
                     validate=lambda staged: {})
    trace_graphs(plan, options, SIZE["max_seq_len"], tmp, quiet)
    return tmp


def test_streamed_weights_file_equals_the_loaded_models(checkpoint: Path, streamed: Path, tmp_path: Path) -> None:
    loaded = loaded_trace(checkpoint, tmp_path)
    assert (streamed / "weights.bin").read_bytes() == (loaded / "weights.bin").read_bytes()
    feeds = step_feeds(json.loads((streamed / "manifest.json").read_text())["special_ids"]["mask"])
    got = run(streamed / "step.onnx", feeds)
    want = run(loaded / "step.onnx", feeds)
    assert got.keys() == want.keys()
    for name in got:
        assert np.array_equal(got[name], want[name]), name  # the same weights, the same computation


def step_feeds(mask_id: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 4000, (2, 40))
    ids[:, 24:] = mask_id
    mask = np.ones_like(ids)
    mask[1, :6] = 0
    return {"input_ids": ids, "attention_mask": mask, "temperature": np.array([0.0, 0.7], dtype=np.float32),
            "sample_uniform": rng.random((2, 40), dtype=np.float32),
            "candidates": np.broadcast_to(np.arange(24, 40), (2, 16)).copy(), "with_stats": np.ones(2, dtype=np.int64),
            **scoring_feed(2, None)}


def run(graph: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def test_layer_streamed_reference_equals_the_loaded_models(checkpoint: Path) -> None:
    weights = checkpoint_weights(checkpoint)
    stats = StatsSpec.from_config(None, weights.config.n_layers)
    probes = make_probes(weights.config, SIZE["max_seq_len"])
    streamed_refs = streamed_references(weights.config, weight_sources(weights), stats, probes)[torch.float32]
    loaded_refs = torch_references(load_checkpoint(checkpoint).model, stats, probes)
    for got, want in zip(streamed_refs, loaded_refs, strict=True):
        assert np.array_equal(got.logits, want.logits) and np.array_equal(got.stats, want.stats)
        assert np.array_equal(got.kv, want.kv)


def test_export_memory_stays_near_the_weights(tmp_path: Path) -> None:
    checkpoint = random_checkpoint(tmp_path, WIDE, 256 * MiB)
    written = measure_export(checkpoint, tmp_path / "written", verify=False)
    weights = written["weights"]  # float16, 480 MiB
    # Tracing and writing, measured on the 2-core Xeon: loading the model (float32, 2x the float16 weights), its float16
    # copy and the traced graphs' copies added 1298 MiB (2.7x the weights) before streaming; streamed, 389 MiB (what
    # tracing holds, whatever the model's size, and one tensor being converted).
    assert written["peak"] - written["before"] < 0.5 * weights + 300 * MiB, written
    # With the check against torch: the reference holds one layer at a time in float32 and float16 (a layer is half
    # the weights here: 1.5x the float16 weights at most), then ONNX Runtime maps the weights file and casts one
    # weight at a time (1x, and its validation twin's sessions are closed before the export's open). Measured 1130
    # MiB added when alone (2.35x the weights); more when the allocator's arenas fragment under load. Bounded by the
    # weights, not by the export's own estimate: 3x the float16 weights and what tracing holds.
    checked = measure_export(checkpoint, tmp_path / "checked", verify=True)
    assert checked["peak"] - checked["before"] < 3 * weights + 300 * MiB, checked


def measure_export(checkpoint: Path, out: Path, verify: bool) -> dict[str, int]:
    """Export in a fresh interpreter: its memory once the libraries are imported, its high-water mark, the weights."""
    done = subprocess.run([sys.executable, "-c", MEASURE, str(checkpoint), str(out), str(verify)],
                          capture_output=True, text=True, timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("short", ["disk", "memory"])
def test_an_export_that_cannot_fit_is_refused_before_any_work(checkpoint: Path, tmp_path: Path, cli_exit: Any,
                                                              monkeypatch: pytest.MonkeyPatch, short: str) -> None:
    need = footprint(weight_sources(checkpoint_weights(checkpoint)), torch.float32, verify=True)
    if short == "disk":
        monkeypatch.setattr(resources, "free_disk", lambda dest: need.disk - 1)
    else:
        monkeypatch.setattr(resources, "available_memory", lambda: need.memory // 2)
    out = tmp_path / "export"
    code, stdout, err = cli_exit(["export", str(checkpoint), "--out", str(out)])
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert f"{need.disk / 2**30:.1f} GiB" in err if short == "disk" else f"{need.memory / 2**30:.1f} GiB" in err
    assert "--no-resource-check" in err and not out.exists() and list(tmp_path.iterdir()) == []
    code, stdout, err = cli_exit(["export", str(checkpoint), "--out", str(out), "--no-resource-check", "--no-verify"])
    assert code == 0, err  # the flag proceeds (the machine has the room the patched figures deny)


def test_json_progress_names_every_stage_and_counts_the_bytes(checkpoint: Path, tmp_path: Path, cli_exit: Any) -> None:
    code, stdout, err = cli_exit(["export", str(checkpoint), "--out", str(tmp_path / "export"), "--kv-cache", "--json"])
    assert code == 0, err
    events = [json.loads(line) for line in err.splitlines()]
    stages = [event["stage"] for k, event in enumerate(events) if k == 0 or events[k - 1]["stage"] != event["stage"]]
    assert stages == list(STAGES)  # in order, each once
    written = [event for event in events if event.get("tensor")]
    result = json.loads(stdout)
    assert written and written[-1]["bytes_done"] == result["weights_bytes"]
    assert all(event["bytes_total"] == written[0]["bytes_total"] for event in written)
    assert [e["bytes_done"] for e in written] == sorted(e["bytes_done"] for e in written)
    assert result["verified"] and result["files"] == ["step.onnx", "window_step.onnx", "prompt_step.onnx",
                                                      "weights.bin"]
