"""The decoding rules from the outside: `generate` runs each family's own rule unless told otherwise and names it in
--json; `--decode` and its parameters reach the loop; bad values are one line and exit 2 before any work; the
server takes the same fields per request and refuses bad ones with HTTP 400 naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_cli import run
from test_families_text import family_checkpoint

from seer_deploy.core.generation import GenerationConfig
from seer_deploy.models.families.families import authors_rule
from seer_deploy.runtime.targets import TargetOptions
from seer_deploy.seer.options import SeerOptions
from seer_deploy.serve import BackgroundServer, ServeOptions, create_app
from seer_deploy.service import Prompt, Service, ServiceOptions


@pytest.fixture(scope="module")
def dream_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family_checkpoint(tmp_path_factory.mktemp("cli-dream"), "dream")[1]


def records(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_each_family_runs_its_authors_rule_by_default(dream_ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert authors_rule("dream", False) == {"decode": "timesteps", "remasking": "entropy"}
    assert authors_rule("dream", True) == {"decode": "timesteps", "remasking": "topk_margin",  # LaViDa-Dream
                                           "first_from_prompt": True}
    assert authors_rule("dimple", False) == {"decode": "timesteps", "remasking": "maskgit_plus"}
    assert authors_rule("llada", True) == authors_rule("mmada", False) == {"decode": "fixed",
                                                                          "remasking": "low_confidence"}
    base = ["generate", str(dream_ckpt), "--prompt", "sort 3 1 2", "--gen-length", "8", "--json", "--no-seer"]
    code, out, err = run(base, capsys)
    assert code == 0, err
    decode = records(out)[0]["decode"]
    assert (decode["rule"], decode["remasking"], decode["eps"]) == ("timesteps", "entropy", 1e-3)
    code, out, err = run([*base, "--decode", "fixed"], capsys)
    assert code == 0, err
    assert records(out)[0]["decode"]["rule"] == "fixed"
    code, out, err = run([*base, "--decode", "confident", "--remasking", "topk_margin", "--threshold", "0.5"], capsys)
    assert code == 0, err
    assert records(out)[0]["decode"] | {"rule": "confident", "remasking": "topk_margin", "threshold": 0.5} == (
        records(out)[0]["decode"])


def test_the_service_applies_the_rule_once_the_family_is_known(dream_ckpt: Path) -> None:
    service = Service(dream_ckpt, ServiceOptions(generation=GenerationConfig(gen_length=8, steps=8, family_rule=True),
                                                 seer=SeerOptions(on=False)))
    assert (service.options.generation.decode, service.options.generation.remasking) == ("timesteps", "entropy")
    answer = service.generate([Prompt("sort 3 1 2")]).answers[0]
    assert answer.passes <= 8
    kept = Service(dream_ckpt, ServiceOptions(generation=GenerationConfig(gen_length=8, steps=8), seer=SeerOptions(on=False)))
    assert kept.options.generation.decode == "fixed"  # a rule named (or the default without authors_rule) stays


@pytest.mark.parametrize("flags, words", [
    (["--eps", "0"], "eps is 0.0"),
    (["--eps", "1.5"], "eps is 1.5"),
    (["--alg-temp", "-1"], "alg_temp is -1.0"),
    (["--top-p", "0"], "top_p is 0.0"),
    (["--top-p", "1.2"], "top_p is 1.2"),
    (["--decode", "confident", "--threshold", "0"], "threshold is 0.0"),
    (["--decode", "confident", "--threshold", "1.5"], "threshold is 1.5"),
    (["--decode", "fixed", "--remasking", "entropy"], "--remasking entropy is a rule of the Dream family"),
    (["--decode", "timesteps", "--remasking", "random"], "--remasking random is LLaDA's"),
    (["--decode", "timesteps", "--block-length", "4"], "has no blocks"),
])
def test_bad_rule_settings_are_one_line_and_exit_2(dream_ckpt: Path, capsys: pytest.CaptureFixture[str],
                                                   flags: list[str], words: str) -> None:
    code, out, err = run(["generate", str(dream_ckpt), "--prompt", "1 2", "--gen-length", "8", *flags], capsys)
    assert code == 2 and out == ""
    assert words in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def server(dream_ckpt: Path) -> Any:
    service = Service(dream_ckpt, ServiceOptions(generation=GenerationConfig(gen_length=8, steps=8), seer=SeerOptions(on=False),
                                                 batch_size=2, target=TargetOptions(threads=1)))
    with BackgroundServer(create_app(service, ServeOptions(model_name="dream"))) as running:
        yield running


@pytest.mark.parametrize("fields, param", [
    ({"eps": 0.0}, "eps"), ({"decode": "timesteps", "alg_temp": -1.0}, "alg_temp"),
    ({"decode": "timesteps", "top_p": 0.0}, "top_p"), ({"decode": "confident", "threshold": 0.0}, "threshold"),
    ({"decode": "sideways"}, "decode"), ({"remasking": "entropy", "decode": "fixed"}, "remasking"),
])
def test_the_server_refuses_bad_rule_fields_naming_them(server: Any, fields: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "1 2", "max_tokens": 8, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]


def test_the_server_runs_a_requests_rule(server: Any) -> None:
    for fields in ({}, {"remasking": "topk_margin"}, {"decode": "confident", "remasking": "entropy",
                                                     "threshold": 0.5}, {"top_p": 1.0}):
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "1 2", "max_tokens": 8, **fields})
        assert r.status_code == 200, (fields, r.text)


def test_calibration_works_for_a_dream_rule() -> None:
    """Seer's calibration reads the answers of the rule it is given (their true lengths fit the cut): Dream's sampler
    on the demo here (a random tiny checkpoint never ends an answer, so its cut cannot be fitted); generation with
    the fitted config under that rule keeps every answer's end."""
    from seer_deploy.calibration.detector_fit import CalibrationOptions, calibrate_model
    from seer_deploy.calibration.prompt_set import prepare_prompts
    from seer_deploy.models.demos.demo_tasks import heldout_examples

    config = GenerationConfig(gen_length=24, steps=24, decode="timesteps", remasking="entropy")
    prepared = prepare_prompts("demo", [Prompt(e.prompt) for e in heldout_examples(16)], config, 16, None)
    result = calibrate_model(prepared.source, prepared.ids, config, CalibrationOptions(detector="eos", holdout=0.5),
                             batch_size=16)
    assert result.report["n_calibration"] == 8 and result.config.detector == "eos"
    validation = result.report["detectors"]["eos"]["validation"]
    assert validation["safe"] >= 0.875 and validation["mean_kept"] < 24  # it cuts, and keeps the answers' ends
