"""The demo task's documents for lm-eval (custom_dataset): demo.jsonl beside this file, read locally."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load(**_: Any) -> dict[str, Any]:
    from datasets import Dataset

    lines = (Path(__file__).resolve().parent / "demo.jsonl").read_text().splitlines()
    return {"test": Dataset.from_list([json.loads(line) for line in lines if line.strip()])}
