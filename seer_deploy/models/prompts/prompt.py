"""A request: a prompt, and the pictures its `<image>` placeholders stand for; and the prompts file that holds them.

A prompts file (`generate --prompts`, `calibrate --prompts`) holds JSON lines {"prompt": ..., "image": PATH or
[PATH, ...]} (one image per `<image>` placeholder, in order; a relative path is relative to the file) or plain text
lines. Every check here runs before any model loads, and names the prompt (its file and line) that failed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.files import read_text
from seer_deploy.models.checkpoints.multimodal_files import IMAGE_TOKEN
from seer_deploy.models.pictures.image import load_image
from seer_deploy.models.text.tokenizer import check_prompt

ImageSource = str | os.PathLike[str] | Image.Image  # a picture's file, or the picture itself


@dataclass(frozen=True)
class Prompt:
    """One prompt and its pictures in `<image>` order; `where` names it in error messages. A chat request also
    holds its conversation, (role, content) pairs rendered by the model's chat template (Tokenizer.encode_request);
    its `prompt` is then the contents joined, which its `<image>` placeholders are counted in."""

    prompt: str
    images: tuple[ImageSource, ...] = ()
    where: str = "the prompt"
    messages: tuple[tuple[str, str], ...] = ()


def read_prompts_file(file: Path) -> list[Prompt]:
    """The requests of a JSON-lines (or plain-text) file; ConfigError naming the line for a malformed one."""
    lines = enumerate(read_text(file, "prompts file").splitlines(), start=1)
    requests = [parse_prompt_line(line, f"{file}:{n}", file.parent) for n, line in lines if line.strip()]
    if not requests:
        raise ConfigError(f"{file} holds no prompt; give one JSON object {{\"prompt\": ...}} or one prompt per line")
    return requests


def parse_prompt_line(line: str, where: str, base: Path) -> Prompt:
    """A plain line is a text prompt; a JSON object gives 'prompt' and optionally 'image' (paths relative to base)."""
    if not line.lstrip().startswith("{"):
        return Prompt(check_prompt(line, where), where=where)
    try:
        record = json.loads(line)
        text = record["prompt"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: expected {{\"prompt\": \"...\", \"image\": \"PATH\"}} ({exc})") from exc
    field = record.get("image", [])
    paths = [field] if isinstance(field, str) else field
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ConfigError(f"{where}: 'image' must be a path or a list of paths, one per {IMAGE_TOKEN} in the prompt")
    return Prompt(check_prompt(text, where), tuple(base / Path(p).expanduser() for p in paths), where)


def assign_images(texts: Sequence[str], images: Sequence[ImageSource]) -> list[Prompt]:
    """Requests from prompts and a flat list of images handed to their `<image>` placeholders in order (the CLI's
    --prompt / --image); ConfigError when the counts differ."""
    wanted = [t.count(IMAGE_TOKEN) for t in texts]
    total = sum(wanted)
    if total != len(images):
        if total == 0:
            fix = f"put '{IMAGE_TOKEN}' in the prompt where the image goes, e.g. --prompt '{IMAGE_TOKEN} colors'"
        elif total < len(images):
            fix = f"add an '{IMAGE_TOKEN}' per extra image or drop the extra --image"
        else:
            fix = f"give one --image per '{IMAGE_TOKEN}' or remove the extra placeholders"
        raise ConfigError(
            f"the prompt(s) hold {total} {IMAGE_TOKEN} placeholder(s) but {len(images)} image(s) were given; {fix}"
        )
    requests, i = [], 0
    for text, n in zip(texts, wanted, strict=True):
        requests.append(Prompt(check_prompt(text), tuple(images[i : i + n])))
        i += n
    return requests


def check_prompt_images(requests: Sequence[Prompt], target: str, multimodal: bool) -> None:
    """ConfigError, before any model loads, for pictures given to a text model or a prompt whose `<image>`
    placeholders and pictures differ in number."""
    for request in requests:
        if request.images and not multimodal:
            raise ConfigError(
                f"{request.where} gives an image, but '{target}' is a text model; give a multimodal checkpoint "
                f"(demo-vl, a LLaDA-V-layout directory) or an export or engine made from one, or drop the image"
            )
        placeholders = request.prompt.count(IMAGE_TOKEN)
        if multimodal and placeholders != len(request.images):
            raise ConfigError(f"{request.where} has {placeholders} {IMAGE_TOKEN} placeholder(s) but "
                              f"{len(request.images)} image(s); give one image per {IMAGE_TOKEN}, in order")


def image_name(source: ImageSource) -> str:
    """A picture's file name, for listings ('<picture>' for one given in memory)."""
    return "<picture>" if isinstance(source, Image.Image) else Path(source).name


def load_pictures(requests: Sequence[Prompt]) -> list[list[Image.Image]]:
    """Every request's pictures, read in full (so a bad file fails here, in one line naming its request)."""
    return [[_picture(source, request.where) for source in request.images] for request in requests]


def _picture(source: ImageSource, where: str) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    try:
        return load_image(source)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
