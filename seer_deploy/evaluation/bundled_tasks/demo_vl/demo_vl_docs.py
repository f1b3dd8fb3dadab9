"""The demo-vl task's documents for lm-eval (custom_dataset, doc_to_image): demo_vl.jsonl beside this file, each
picture drawn from its shapes as the bench draws it (demo_data.picture, which lmms-eval's demo_vl task uses too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load(**_: Any) -> dict[str, Any]:
    from datasets import Dataset

    lines = (Path(__file__).resolve().parent / "demo_vl.jsonl").read_text().splitlines()
    return {"test": Dataset.from_list([json.loads(line) for line in lines if line.strip()])}


def picture(doc: dict[str, Any]) -> list[Any]:
    from seer_deploy.evaluation.demo_data import picture

    return picture(doc)
