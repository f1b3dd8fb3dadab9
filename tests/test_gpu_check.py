"""scripts/gpu_check.py on a CPU with --quick: every section runs on the code path the GPU check takes (ONNX Runtime
with IO binding, the torch device, fp16 exports, the timing split), so a GPU run does not find its bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_every_section_on_a_cpu(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--quick", "--device", "cpu",
                           "--out", str(out)], check=False, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    sections = data["sections"]
    assert set(sections) == {"environment", "export", "parity", "demo_pass", "seer_speed", "large_model"}
    failed = {name: s.get("error") for name, s in sections.items() if not s["ok"]}
    assert not failed, failed
    parity = sections["parity"]
    for variant in ("io_binding", "cuda_graph"):
        assert {parity[variant][m]["same_tokens"] for m in ("seer", "paper_cut", "full")} == {1.0}
        assert parity[variant]["bound_shapes"]["step"] > 0  # the IO-bound runner served the steps
    assert parity["torch"]["same_tokens"] == 1.0
    for name, row in sections["demo_pass"].items():
        if isinstance(row, dict):
            assert row["passes"] > 0 and 0 < row["engine_ms_per_pass"] <= row["wall_ms_per_pass"], name
    for row in sections["seer_speed"].values():
        if isinstance(row, dict):
            assert row["seer_passes"] < row["full_passes"] and row["same_as_full"] == 1.0
    large = sections["large_model"]
    assert large["demo_fp16_same_tokens_as_fp32"] == 1.0
    assert [p["kept"] for p in large["io_binding"]] == [16, 32]
    markdown = out.with_suffix(".md").read_text()  # what BENCHMARKS.md includes from a GPU run
    assert "| ONNX Runtime, io_binding | 1.000 of" in markdown and "| kept length |" in markdown
    assert set(data["targets"]) == {"demo_pass_ms_under_0.5", "large_step_within_2x_of_bound",
                                    "seer_faster_than_full_everywhere", "seer_vs_oracle_at_least_0.7"}
