"""lm-evaluation-harness's own `local-completions` client against `seer-deploy serve` (a server on loopback, started
and stopped here) scores the bundled demo task as `seer-deploy eval` does on the same documents, answer for answer:
the served path and the direct path are one service.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import requires_demo

from seer_deploy.cli import main
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.evaluation.tasks import HARNESSES, go_offline
from seer_deploy.serve import BackgroundServer, ServeOptions, create_app
from seer_deploy.service import Service, ServiceOptions, TargetOptions

DOCUMENTS = 12
GEN = GenerationConfig(gen_length=64, steps=64)  # the demo task asks max_gen_toks 64: the served canvas is 64


@pytest.fixture(scope="module")
def export_dir(shared_demo_export: Callable[[str], Path]) -> Path:
    return shared_demo_export("demo")


@pytest.fixture(scope="module")
def server(export_dir: Path) -> Iterator[BackgroundServer]:
    """The export served as `seer-deploy serve` serves it: Seer on (its calibrated config), full steps."""
    service = Service(export_dir, ServiceOptions(generation=GEN, batch_size=8, target=TargetOptions(threads=1)))
    with BackgroundServer(create_app(service, ServeOptions(model_name="demo", max_batch=8, max_wait_ms=5))) as running:
        yield running


@requires_demo
def test_local_completions_scores_as_eval_does(export_dir: Path, server: BackgroundServer, tmp_path: Path) -> None:
    go_offline()
    from lm_eval import simple_evaluate

    served = simple_evaluate(
        model="local-completions",
        model_args={"model": "demo", "base_url": f"{server.url}/v1/completions", "tokenizer_backend": None,
                    "tokenized_requests": False, "num_concurrent": 1, "max_retries": 1},
        tasks=["demo"], task_manager=HARNESSES["lm-eval"].task_manager(), limit=DOCUMENTS, log_samples=True, bootstrap_iters=0)
    assert served is not None
    samples = sorted(served["samples"]["demo"], key=lambda s: s["doc_id"])
    served_answers = [s["resps"][0][0] for s in samples]

    report = tmp_path / "eval.json"
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(export_dir), "--tasks", "demo", "--modes", "full,seer", "--limit", str(DOCUMENTS),
              "--gen-length", "64", "--batch-size", "8", "--threads", "1", "--json", str(report)])
    assert exc.value.code == 0
    seer = next(r for r in json.loads(report.read_text())["rows"] if r["mode"] == "seer")
    assert seer["answers"] == served_answers
    assert seer["score"] == pytest.approx(served["results"]["demo"]["exact_match,none"])
    assert seer["score"] > 0.5  # the demo answers most held-out prompts right: a real score, not two zeros


@requires_demo
def test_a_mode_the_export_cannot_run_is_refused_before_any_answer(export_dir: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(export_dir), "--tasks", "demo", "--modes", "full,seer-fast", "--limit", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert "--kv-cache" in err[0] and "re-export" in err[0]
