"""`seer-deploy eval --harness lmms-eval`: lmms-eval's own loop on demo-vl with pictures, mode by mode, gives the
answers that the service gives the bench's held-out pictures with the same flags, scored as their exact match; the
DocVQA recipe (lmms-eval's docvqa_val over a local copy) runs; the install left the torch pin in place.

The bundled lmms-eval demo_vl task holds the documents of lm-eval's (the bench's held-out pictures). A canvas of 4
is shorter than some answers (describe: up to 8 tokens), so the score sits between 0 and 1 and agreeing with the
service means agreeing document by document.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import requires_demo
from PIL import Image

from seer_deploy.cli import main
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.evaluation.answering import picture_request
from seer_deploy.evaluation.demo_data import demo_vl_records
from seer_deploy.evaluation.tasks import LMMS_EVAL
from seer_deploy.service import SeerOptions, ServiceOptions, TargetOptions, generate

ROOT = Path(__file__).resolve().parents[1]
PICTURES = 10
GEN = 4
# The eval's modes as `generate` runs them (modes.py: the threshold modes' blocks of 32 do not divide 4: one block).
SERVICE_OPTIONS = {
    "full": ServiceOptions(generation=GenerationConfig(gen_length=GEN, steps=GEN), seer=SeerOptions(on=False)),
    "seer": ServiceOptions(generation=GenerationConfig(gen_length=GEN, steps=GEN), seer=SeerOptions(on=True)),
    "seer-fast": ServiceOptions(generation=GenerationConfig(gen_length=GEN, steps=GEN, decode="threshold",
                                                            threshold=0.9, kv_cache=True), seer=SeerOptions(on=True)),
}


def _cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0)


def test_the_install_kept_the_torch_pin_and_the_pinned_lmms_eval() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(p for p in pins if p.startswith("torch=="))
    assert importlib.metadata.version("torch").split("+")[0] == torch_pin.removeprefix("torch==")
    assert importlib.metadata.version("lmms-eval") == LMMS_EVAL.removeprefix("lmms-eval==")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("torchvision")  # lmms-eval's own list would have brought it (docs/evaluation.md)


def test_pictures_without_placeholders_get_them_in_front() -> None:
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    request = picture_request("What is written?", [rgba, rgba])
    assert request.prompt == "<image> <image>\nWhat is written?"
    assert [p.mode for p in request.images] == ["RGB", "RGB"]  # type: ignore[union-attr]
    assert picture_request("<image> colors", [rgba]).prompt == "<image> colors"
    assert picture_request("sort 31").images == ()


@requires_demo
def test_lmms_eval_on_demo_vl_answers_as_the_service_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from seer_deploy.bench.workloads import picture_workload

    report = tmp_path / "vl.json"
    rc = _cli(["eval", "demo-vl", "--harness", "lmms-eval", "--tasks", "demo_vl", "--modes", ",".join(SERVICE_OPTIONS),
               "--limit", str(PICTURES), "--gen-length", str(GEN), "--batch-size", "8", "--threads", "1",
               "--json", str(report)])
    assert rc == 0
    printed = capsys.readouterr().out
    record = json.loads(report.read_text())
    assert record["settings"]["harness"] == "lmms-eval"
    assert record["command"].startswith("seer-deploy eval demo-vl --tasks demo_vl --harness lmms-eval --modes full,")
    rows = {r["mode"]: r for r in record["rows"]}
    assert list(rows) == list(SERVICE_OPTIONS)

    workload = picture_workload(PICTURES, tmp_path / "pictures")  # the bench's requests: PNG files, as a user's
    expected = [e.answer for e in workload.examples]
    assert expected == [r["answer"] for r in demo_vl_records(PICTURES)]
    for mode, options in SERVICE_OPTIONS.items():
        row = rows[mode]
        served = generate(workload.requests, "demo-vl", replace(options, batch_size=8, target=TargetOptions(threads=1)))
        assert row["answers"] == [a.text for a in served.answers], mode
        assert row["metric"] == "exact_match,none" and row["documents"] == PICTURES
        assert row["scores"] == [float(a == e) for a, e in zip(row["answers"], expected, strict=True)], mode
        assert row["tokens_processed"] == served.tokens_processed and row["passes"] == served.passes, mode
        assert f"{row['score']:.4f}" in printed
    full, seer = rows["full"], rows["seer"]
    assert 0 < full["score"] < 1  # some answers longer than the canvas: a real score, not all right or all wrong
    assert seer["tokens_processed"] < full["tokens_processed"] and seer["mean_kept"] < GEN  # Seer's cut
    assert full["passes"] == 2 * GEN  # two batches (8 + 2 pictures), GEN steps each


@requires_demo
def test_readme_docvqa_recipe_reads_local_files_offline(tmp_path: Path) -> None:
    """docs/evaluation.md's DocVQA recipe on a two-question copy of DocVQA's format: lmms-eval's own docvqa_val (its prompt
    with no `<image>` in it, its ANLS metric) on local parquet, no download. demo-vl reads shapes, not words: it scores
    0; the run is the point."""
    import lmms_eval
    from datasets import Dataset, Features, Sequence, Value
    from datasets import Image as ImageFeature

    data = tmp_path / "docvqa"
    data.mkdir()
    rows = [{"questionId": str(i), "question": "What word is written?", "answers": [word], "docId": i,
             "image": Image.new("RGB", (64, 64), "white")} for i, word in enumerate(["invoice", "total"])]
    features = Features({"questionId": Value("string"), "question": Value("string"), "docId": Value("int64"),
                         "answers": Sequence(Value("string")), "image": ImageFeature()})
    Dataset.from_list(rows, features=features).to_parquet(str(data / "validation-00000-of-00001.parquet"))
    tasks = tmp_path / "my-tasks"
    tasks.mkdir()
    included = Path(lmms_eval.__file__).parent / "tasks" / "docvqa" / "docvqa_val.yaml"
    (tasks / "docvqa_local.yaml").write_text(
        f"include: {included}\ntask: docvqa_local\ndataset_path: parquet\ndataset_name: null\n"
        f"dataset_kwargs: {{data_files: {{validation: {data}/validation-*.parquet}}, cache_dir: {tmp_path / 'cache'}}}\n")
    report = tmp_path / "docvqa.json"
    rc = _cli(["eval", "demo-vl", "--harness", "lmms-eval", "--tasks", "docvqa_local", "--include-path", str(tasks),
               "--modes", "full,seer", "--gen-length", "8", "--threads", "1", "--json", str(report)])
    assert rc == 0
    rows = json.loads(report.read_text())["rows"]
    assert [(r["task"], r["mode"], r["metric"], r["documents"]) for r in rows] == [
        ("docvqa_local", "full", "anls,none", 2), ("docvqa_local", "seer", "anls,none", 2)]


@pytest.mark.parametrize(("task", "needle"), [
    ("no_such_task_anywhere", "'no_such_task_anywhere' is neither a task lmms-eval knows"),
    ("docvqa_val", "its data is not on this machine"),  # lmms-eval's own task, its data not local: no download
])
def test_lmms_eval_tasks_it_cannot_run_exit_2_in_one_line(task: str, needle: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc = _cli(["eval", "demo-vl", "--harness", "lmms-eval", "--tasks", task, "--limit", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_without_lmms_eval_the_install_is_named(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "lmms_eval", None)  # as if the --no-deps step had been skipped
    rc = _cli(["eval", "demo-vl", "--harness", "lmms-eval", "--tasks", "demo_vl"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"pip install --no-deps {LMMS_EVAL}" in err[0], err
