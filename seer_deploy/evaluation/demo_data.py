"""The bundled tasks' documents: the demos' held-out prompts and pictures, written as JSON lines beside their YAMLs.

`python -m seer_deploy.evaluation.demo_data` rewrites them; a test checks the shipped files equal what this writes,
so the eval's documents stay the bench's held-out ones (the first N of each are the bench's --prompts N).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

DOCUMENTS = 40  # per task: a --limit picks the first ones
TASKS_DIR = Path(__file__).resolve().parent / "bundled_tasks"
DEMO_FILE = TASKS_DIR / "demo" / "demo.jsonl"
DEMO_VL_FILE = TASKS_DIR / "demo_vl" / "demo_vl.jsonl"


def demo_records(n: int = DOCUMENTS) -> list[dict[str, Any]]:
    from seer_deploy.models.demos.demo_tasks import heldout_examples

    return [{"task": e.task, "digits": e.digits, "prompt": e.prompt, "answer": e.answer} for e in heldout_examples(n)]


def demo_vl_records(n: int = DOCUMENTS) -> list[dict[str, Any]]:
    from seer_deploy.models.demos.demo_vl_tasks import heldout_examples

    return [{"task": e.task, "shapes": [dataclasses.asdict(s) for s in e.shapes], "prompt": e.prompt,
             "answer": e.answer} for e in heldout_examples(n)]


def picture(doc: dict[str, Any]) -> list[Any]:
    """A demo-vl document's picture, drawn from its shapes as the bench draws it: both harnesses' doc_to_image /
    doc_to_visual (the bundled demo_vl YAMLs)."""
    from seer_deploy.models.demos.demo_vl_tasks import Shape, render

    shapes = tuple(Shape(**{**s, "tint": tuple(s["tint"])}) for s in doc["shapes"])
    return [render(shapes)]


def jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


def main() -> None:
    DEMO_FILE.write_text(jsonl(demo_records()))
    DEMO_VL_FILE.write_text(jsonl(demo_vl_records()))
    print(f"wrote {DEMO_FILE} and {DEMO_VL_FILE}")


if __name__ == "__main__":
    main()
