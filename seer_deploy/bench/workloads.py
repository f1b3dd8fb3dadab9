"""What the bench answers: held-out demo prompts, or for a multimodal checkpoint held-out demo-vl pictures.

Each workload is a list of service requests with their expected answers; a picture is written once as a PNG into
the work dir and its request names the file, as a user's request would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seer_deploy.models.demos.demo_tasks import Example
from seer_deploy.models.demos.demo_vl_tasks import PictureExample
from seer_deploy.service import Prompt


@dataclass(frozen=True)
class Workload:
    requests: list[Prompt]
    examples: Sequence[Example | PictureExample]  # with their expected answers, in the requests' order
    description: str


def text_workload(n: int) -> Workload:
    from seer_deploy.models.demos.demo_tasks import heldout_examples

    examples = heldout_examples(n)
    return Workload([Prompt(e.prompt) for e in examples], examples, "held-out demo prompts (tasks in rotation)")


def picture_workload(n: int, directory: Path) -> Workload:
    from seer_deploy.models.demos.demo_vl_tasks import heldout_examples

    directory.mkdir(parents=True, exist_ok=True)
    examples = heldout_examples(n)
    requests = []
    for i, example in enumerate(examples):
        file = directory / f"picture-{i}.png"
        example.image().save(file)
        requests.append(Prompt(example.prompt, (str(file),)))
    return Workload(requests, examples, "held-out demo-vl pictures (colors, shapes, describe, count in rotation)")
