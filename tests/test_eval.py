"""`seer-deploy eval` over the bundled demo task: the table's scores equal the bench's own exact match on the same
held-out prompts, mode by mode; the bundled data are the bench's prompts; the paired interval; one-line refusals
(log-likelihood tasks, unknown modes and tasks) with exit 2.

The bench (gen 16, batch 8, the first 10 held-out prompts) runs once here; `seer-deploy eval demo` then answers the
same 10 prompts in batches of 8, through the same service, and lm-evaluation-harness scores them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import requires_demo

from seer_deploy.cli import main
from seer_deploy.evaluation.demo_data import DEMO_FILE, DEMO_VL_FILE, demo_records, demo_vl_records, jsonl
from seer_deploy.evaluation.modes import MODES, parse_modes
from seer_deploy.evaluation.paired import paired_difference

PROMPTS = 10
# A canvas shorter than 6 of the 10 answers: the scores sit well between 0 and 1, so agreeing with the bench means
# agreeing document by document, not two perfect scores.
GEN = 16
# The eval's modes and the bench rows that run the same settings (the fast rows: threshold 0.9, blocks of 32, the
# dual KV cache); torch and ONNX Runtime give the demo the same tokens (tests/test_demo_parity.py).
SAME_AS_BENCH = {"full": "reference", "seer": "torch-seer", "seer-fast": "ort-seer-fast", "fast": "ort-fastdllm"}


def _cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_bundled_documents_are_the_bench_held_out_prompts_and_pictures() -> None:
    assert DEMO_FILE.read_text() == jsonl(demo_records())
    assert DEMO_VL_FILE.read_text() == jsonl(demo_vl_records())


def test_modes_start_with_full_and_unknown_ones_are_named() -> None:
    assert [m.name for m in parse_modes("seer,seer-fast")] == ["full", "seer", "seer-fast"]
    assert [m.name for m in parse_modes("seer, full,seer")] == ["full", "seer"]
    assert [m.name for m in parse_modes("all")] == list(MODES)


def test_paired_interval() -> None:
    same = paired_difference([1, 0, 1, 1], [1, 0, 1, 1])
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0)
    worse = paired_difference([0, 0, 1, 1] * 10, [1, 1, 1, 1] * 10)
    assert worse.mean == -0.5 and worse.low < -0.5 < worse.high < 0  # a real drop: the interval excludes 0
    assert paired_difference([0, 1] * 5, [1, 0] * 5).low < 0 < paired_difference([0, 1] * 5, [1, 0] * 5).high
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 0.0])


def test_stop_sequences_cut_at_the_first() -> None:
    from seer_deploy.evaluation.answering import cut_at_stops

    assert cut_at_stops("12\n34 Question: x", ["Question:", "\n"]) == "12"
    assert cut_at_stops("1234", ["\n", ""]) == "1234"


@pytest.fixture(scope="module")
def bench_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("eval-bench")
    rc = _cli(["bench", "demo", "--gen-lengths", str(GEN), "--batch-sizes", "8", "--prompts", str(PROMPTS),
               "--repeats", "1", "--threads", "1", "--no-scaling", "--no-tensorrt", "--quantize", "none",
               "--out", str(out)])
    assert rc == 0
    return {r["row"]: r for r in json.loads((out / "bench.json").read_text())["rows"]}


@requires_demo
def test_eval_demo_scores_equal_the_bench_exact_match(bench_rows: dict[str, dict[str, Any]], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "eval.json"
    rc = _cli(["eval", "demo", "--tasks", "demo", "--modes", ",".join(SAME_AS_BENCH), "--limit", str(PROMPTS),
               "--gen-length", str(GEN), "--batch-size", "8", "--threads", "1", "--json", str(report)])
    assert rc == 0
    printed = capsys.readouterr().out
    rows = {r["mode"]: r for r in json.loads(report.read_text())["rows"]}
    assert list(rows) == list(SAME_AS_BENCH)
    expected = [r["answer"] for r in demo_records(PROMPTS)]
    for mode, bench_row in SAME_AS_BENCH.items():
        row = rows[mode]
        assert row["documents"] == PROMPTS and row["metric"] == "exact_match,none"
        assert row["score"] == pytest.approx(bench_rows[bench_row]["exact_match"], abs=1e-4), mode
        assert row["scores"] == [float(a == e) for a, e in zip(row["answers"], expected, strict=True)]
        assert row["identical_to_full"] == pytest.approx(bench_rows[bench_row]["identical_to_full"], abs=1e-4), mode
        assert row["tokens_processed"] > 0 and row["passes"] > 0 and row["seconds"] > 0
        assert f"{row['score']:.4f}" in printed
    full, seer = rows["full"], rows["seer"]
    assert full["vs_full"] is None and full["identical_to_full"] == 1.0 and full["mean_kept"] is None
    assert seer["vs_full"]["low"] <= seer["vs_full"]["mean"] <= seer["vs_full"]["high"]
    assert seer["mean_kept"] == pytest.approx(bench_rows["torch-seer"]["mean_kept"], abs=0.01)
    assert seer["tokens_processed"] < full["tokens_processed"]  # Seer's cut: the point of the table
    assert full["passes"] == 2 * GEN  # two batches (8 + 2 documents), GEN steps each
    assert 0 < full["score"] < 1
    markdown = report.with_suffix(".md").read_text()
    assert markdown.startswith("Command: `seer-deploy eval demo --tasks demo --modes full,seer,seer-fast,fast")
    assert "| demo | seer-fast |" in markdown


@requires_demo
def test_eval_demo_vl_answers_about_pictures(tmp_path: Path) -> None:
    report = tmp_path / "vl.json"
    rc = _cli(["eval", "demo-vl", "--tasks", "demo_vl", "--modes", "full,seer", "--limit", "4", "--gen-length", "32",
               "--batch-size", "4", "--threads", "1", "--json", str(report)])
    assert rc == 0
    rows = {r["mode"]: r for r in json.loads(report.read_text())["rows"]}
    expected = [r["answer"] for r in demo_vl_records(4)]
    for row in rows.values():
        assert row["scores"] == [float(a == e) for a, e in zip(row["answers"], expected, strict=True)]
    assert rows["full"]["score"] >= 0.5  # the demo-vl model reads its pictures (a text-only guess scores ~0)


def test_loglikelihood_tasks_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "docs.py").write_text("from datasets import Dataset\n\n\ndef load(**_):\n"
                                   "    return {'test': Dataset.from_list([{'prompt': 'sort 21'}])}\n")
    (tasks / "choice.yaml").write_text(
        "task: demo_choice\ndataset_path: json\ncustom_dataset: !function docs.load\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{prompt}}'\ndoc_to_target: 0\ndoc_to_choice: ['a', 'b']\n")
    rc = _cli(["eval", "demo", "--tasks", "demo_choice", "--include-path", str(tasks)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "demo_choice" in err[0] and "log-probabilities" in err[0] and "generate_until" in err[0]


def test_without_the_harness_the_fix_is_named(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if the [eval] extra were not installed
    rc = _cli(["eval", "demo", "--tasks", "demo"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "pip install 'seer-deploy[eval]'" in err[0], err


@pytest.mark.parametrize(("argv", "needle"), [
    (["--modes", "full,turbo"], "unknown mode 'turbo'"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--tasks", "no_such_task_anywhere"], "'no_such_task_anywhere'"),
])
def test_bad_arguments_exit_2_in_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["eval", "demo", "--tasks", "demo", *argv]
    rc = _cli(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


@requires_demo
def test_readme_gsm8k_recipe_reads_local_files_offline(tmp_path: Path) -> None:
    """The README's GSM8K command on a two-question copy of GSM8K's format: the harness's own gsm8k task (its
    prompt, few-shot split, filters and metric) on local files, no download. The demo scores 0; the run is the point."""
    import lm_eval

    data = tmp_path / "gsm8k"
    data.mkdir()
    lines = [{"question": f"Tom has {n} apples and buys 2 more. How many now?",
              "answer": f"{n} + 2 = {n + 2}\n#### {n + 2}"} for n in range(4)]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    tasks = tmp_path / "my-tasks"
    tasks.mkdir()
    included = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    (tasks / "gsm8k_local.yaml").write_text(
        f"include: {included}\ntask: gsm8k_local\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs: {{data_files: {{train: {data / 'train.jsonl'}, test: {data / 'test.jsonl'}}}, "
        f"cache_dir: {tmp_path / 'cache'}}}\n")  # the test's own datasets cache, not the user's
    report = tmp_path / "gsm8k.json"
    rc = _cli(["eval", "demo", "--tasks", "gsm8k_local", "--include-path", str(tasks), "--modes", "full,seer",
               "--num-fewshot", "1", "--limit", "2", "--gen-length", "32", "--json", str(report)])
    assert rc == 0
    rows = json.loads(report.read_text())["rows"]
    assert [(r["task"], r["mode"], r["documents"]) for r in rows] == [("gsm8k_local", "full", 2),
                                                                      ("gsm8k_local", "seer", 2)]
    assert rows[0]["metric"] == "exact_match,strict-match"


def test_help_lists_every_mode_with_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["eval", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for mode in MODES.values():
        assert any(line.split()[:1] == [mode.name] and mode.flags in line for line in lines), mode.name
