"""One copy of the weights per process, whatever the number of graphs: the ONNX Runtime sessions of one export read
their initializers from one read-only memory map of weights.bin, and only the sessions a mode runs are opened.

Measured in a fresh subprocess on a model of about 68 MB (float32): the private (anonymous) memory a run of every
graph adds, with the default shared weights and with a copy per session (ONNX Runtime prepacks each session's
MatMul weights into memory of its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_model

from seer_deploy.core.backend import StepInput
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer

SIZE = {"d_model": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 8, "mlp_hidden": 1408, "vocab_size": 4096,
        "max_seq_len": 96}

# Opens the backend, runs step zero, a step, a refresh and a window step, and prints the process's memory (kB).
PROBE = """
import json, sys
import numpy as np
from seer_deploy.core.backend import StepInput, WindowInput
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions

def memory():
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields

before = memory()
backend = OrtBackend(sys.argv[1], OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=1,
                                                   share_weights=sys.argv[2] == "shared"))
opened = list(backend.open_graphs)
ids = np.full((1, 48), int(sys.argv[3]), dtype=np.int64)
ids[0, :16] = 5
backend.step0(StepInput(ids))
backend.step(StepInput(ids))
kv = backend.refresh(StepInput(ids)).kv
backend.window_step(WindowInput(ids[:, 16:32], np.ones_like(ids), np.array([16]), kv))
print(json.dumps({"before": before, "after": memory(), "opened_at_start": opened, "open": backend.open_graphs}))
"""


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights-once")
    write_tokenizer(root / "tokenizer.json")
    model = tiny_model(0, **SIZE)
    ckpt = save_checkpoint(model, root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    return export_checkpoint(ckpt, root / "export", ExportOptions(kv_cache=True, verify=False)).out


def run_probe(export: Path, mode: str) -> dict[str, object]:
    mask_id = json.loads((export / "manifest.json").read_text())["special_ids"]["mask"]
    done = subprocess.run([sys.executable, "-c", PROBE, str(export), mode, str(mask_id)], capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_two_sessions_hold_one_copy_of_the_weights(export: Path) -> None:
    weights = (export / "weights.bin").stat().st_size
    shared, own = run_probe(export, "shared"), run_probe(export, "own")
    anon = {name: run["after"]["RssAnon"] - run["before"]["RssAnon"]  # type: ignore[index]
            for name, run in (("shared", shared), ("own", own))}
    weights_kb = weights / 1024
    # Each session of its own prepacks the MatMul weights (all but the embedding): about two copies for two graphs.
    # Shared, the weights stay file pages of one mapping; what is private is the sessions' state and activations
    # (about 30 MB whatever the model: measured 31 MB here, against 148 MB with a copy per session).
    assert anon["own"] - anon["shared"] > 1.3 * weights_kb, anon
    assert anon["shared"] < weights_kb, anon
    # Sessions open when a graph first runs: none at start, both after a run of every graph.
    assert shared["opened_at_start"] == [] and shared["open"] == ["step", "window_step"]


def test_every_initializer_is_a_view_of_one_memory_map(export: Path) -> None:
    backend = OrtBackend(export, OrtSessionOptions(providers=("CPUExecutionProvider",)))
    backend.open_sessions()
    mapping = backend.weights.mapping
    assert mapping is not None and backend.weights.values
    start = mapping.ctypes.data
    for value in backend.weights.values.values():
        assert start <= value.data_ptr() < start + mapping.size  # no copy: the address lies in the mapping
    # The two graphs' initializers are the same OrtValues: the window graph's are a subset of the step graph's.
    assert len(backend.weights.values) == len({v.data_ptr() for v in backend.weights.values.values()})
    ids = np.full((1, 8), 3, dtype=np.int64)
    assert backend.step(StepInput(ids)).token_ids.shape == (1, 8)  # and they run
