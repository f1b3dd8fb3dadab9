"""A run's peak memory stays within a bound derived from its weights file (issue 48), for fp32, int8 and int4 exports.

Measured in a fresh subprocess on a model of about 35 MB (float32; a 32,768-token vocabulary, so the LM head and its
activations weigh as they do in a real model), both graphs open as a run with the KV cache opens them: the process's
high-water mark above what it held before opening the export (the interpreter and libraries, which
`benchmarks/memory_breakdown.py` reports separately) must stay within

    the weights file (its memory map; a quantized export's mapped pages are dropped once prepacked)
    + a quantized export's packed copies: each session prepacks its own (ONNX Runtime's Python API shares no
      prepacked-weights container), up to twice the file's bytes of the projections (block sums, float32 scales)
    + the head at step zero: HEAD_BUFFERS float32 vocabulary rows per candidate column
    + SESSION_OVERHEAD.

Measured here (ONNX Runtime 1.32, one thread): fp32 78 MiB above start at 96 candidates (33.6 MiB of weights: the head
holds about 3.0 vocabulary rows per candidate, the logits and two temporaries of its softmax), int8 78, int4 71. With
ONNX Runtime's memory pattern on (its default; the CPU sessions turn it off: engines/ort_sessions.py), the steps after
step zero, whose shapes repeat, held every buffer twice: 117, 117 and 110 MiB, 6.3 rows per candidate, which this bound
refuses. With sessions that each prepack their own copy of the MatMul weights (`share_weights=False`) fp32 takes 85 MiB
at 16 candidates against 44 shared: the bound refuses that second copy too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_model

from seer_deploy.contracts.quantization import Quantization
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer

SIZE = {"d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden": 352, "vocab_size": 32768,
        "max_seq_len": 128}
PROMPT, RESPONSE = 16, 96  # every response slot a candidate at step zero: the head's largest call
HEAD_BUFFERS = 4  # the logits and two softmax temporaries (3.0 measured; 6.3 with the memory pattern on)
SESSION_OVERHEAD = 8 * 2**20
FEW = 16  # candidates where the weights, not the head, dominate the bound
EMBEDDING_BYTES = SIZE["vocab_size"] * SIZE["d_model"] * 4  # kept in float32 by --quantize
MiB = 2**20

# Opens the backend and runs step zero and three steps over the response, then prints the process's memory (bytes).
PROBE = """
import json, sys
import numpy as np
from seer_deploy.core.backend import StepInput
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions

def kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":")) * 1024

before = kib("VmRSS")
backend = OrtBackend(sys.argv[1], OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=1,
                                                   share_weights=sys.argv[2] == "shared"))
backend.open_sessions()  # both graphs, as a run with the KV cache opens them
prompt, response = int(sys.argv[4]), int(sys.argv[5])
ids = np.full((1, prompt + response), int(sys.argv[3]), dtype=np.int64)
ids[0, :prompt] = 5
columns = np.arange(prompt, prompt + response)[None, :]
backend.step0(StepInput(ids, candidates=columns))
for _ in range(3):
    backend.step(StepInput(ids, candidates=columns))
print(json.dumps({"before": before, "peak": kib("VmHWM"), "weights": backend.weights.file.stat().st_size}))
"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("footprint")
    write_tokenizer(root / "tokenizer.json")
    ckpt = save_checkpoint(tiny_model(0, **SIZE), root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    made = {}
    for width in ("fp32", "int8", "int4"):
        quant = None if width == "fp32" else Quantization(width)
        made[width] = export_checkpoint(ckpt, root / width, ExportOptions(kv_cache=True, verify=False, quantization=quant)).out
    return made


def peak_above_start(export: Path, mode: str, response: int = RESPONSE) -> tuple[int, int]:
    """(the run's peak RSS above what the process held before opening the export, the weights file's bytes)."""
    mask_id = json.loads((export / "manifest.json").read_text())["special_ids"]["mask"]
    done = subprocess.run([sys.executable, "-c", PROBE, str(export), mode, str(mask_id), str(PROMPT), str(response)],
                          capture_output=True, text=True, timeout=600, check=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return measured["peak"] - measured["before"], measured["weights"]


def bound(weights: int, quantized: bool, candidates: int = RESPONSE) -> int:
    packed = 2 * 2 * (weights - EMBEDDING_BYTES) if quantized else 0
    return weights + packed + HEAD_BUFFERS * candidates * SIZE["vocab_size"] * 4 + SESSION_OVERHEAD


@pytest.mark.parametrize("width", ["fp32", "int8", "int4"])
def test_peak_memory_stays_within_the_weights_bound(exports: dict[str, Path], width: str) -> None:
    peak, weights = peak_above_start(exports[width], "shared")
    limit = bound(weights, width != "fp32")
    assert peak <= limit, f"{width}: peak {peak / MiB:.1f} MiB above start > bound {limit / MiB:.1f}"


def test_the_bound_refuses_a_second_copy_of_the_weights(exports: dict[str, Path]) -> None:
    limit = bound((exports["fp32"] / "weights.bin").stat().st_size, False, FEW)
    shared, _ = peak_above_start(exports["fp32"], "shared", FEW)
    own, _ = peak_above_start(exports["fp32"], "own", FEW)  # each session prepacks its own copy of the MatMuls
    assert shared <= limit < own, f"shared {shared / MiB:.1f}, own {own / MiB:.1f}, bound {limit / MiB:.1f} MiB"
