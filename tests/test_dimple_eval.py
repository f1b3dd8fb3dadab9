"""`seer-deploy eval --harness lmms-eval` on a Dimple checkpoint with pictures (the tiny public-layout one of
tests/dimple_checkpoint.py): lmms-eval's own loop over the bundled demo_vl task gives, mode by mode, the answers the
service gives the bench's held-out pictures, with the same tokens processed and passes; Seer cuts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from dimple_checkpoint import write_dimple

from seer_deploy.cli import main
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.seer.options import SeerOptions
from seer_deploy.service import ServiceOptions, TargetOptions, generate

PICTURES = 4
GEN = 8
# No rule named, as the eval command's flags leave it: Dimple's own (its lmms-eval script's maskgit_plus sampler).
FAMILY_RULE = GenerationConfig(gen_length=GEN, steps=GEN, family_rule=True)
MODES = {"full": ServiceOptions(generation=FAMILY_RULE, seer=SeerOptions(on=False)),
         "seer": ServiceOptions(generation=FAMILY_RULE, seer=SeerOptions(on=True))}


def test_lmms_eval_on_a_dimple_checkpoint_answers_as_the_service_does(tmp_path: Path) -> None:
    from seer_deploy.bench.workloads import picture_workload

    path, _, _ = write_dimple(tmp_path)
    report = tmp_path / "dimple.json"
    with pytest.raises(SystemExit) as done:
        main(["eval", str(path), "--harness", "lmms-eval", "--tasks", "demo_vl", "--modes", ",".join(MODES),
              "--limit", str(PICTURES), "--gen-length", str(GEN), "--batch-size", "4", "--threads", "1",
              "--json", str(report)])
    assert int(done.value.code or 0) == 0
    rows = {r["mode"]: r for r in json.loads(report.read_text())["rows"]}
    assert list(rows) == list(MODES)
    workload = picture_workload(PICTURES, tmp_path / "pictures")
    for mode, options in MODES.items():
        served = generate(workload.requests, str(path), replace(options, batch_size=4,
                                                                  target=TargetOptions(threads=1)))
        assert rows[mode]["answers"] == [a.text for a in served.answers], mode
        assert (rows[mode]["tokens_processed"], rows[mode]["passes"]) == (served.tokens_processed, served.passes)
