"""The multimodal demo's synthetic task: pictures of coloured shapes in a row, questions with answers of varying length.

A 64 x 64 picture holds 1 to 4 shapes (square, circle, triangle) in four 16-pixel columns, one per column at most, in a
random one of four rows, in one of six colours (tinted at random). Each shape is SHAPE_SIZE pixels, centred in one
16 x 16 cell, the demo tower's patch. The geometry inside the cell is fixed on purpose: the first version jittered size
(10-14 px) and offset inside the cell, and the demo's tower (a linear 16 x 16 patch embedding and two 64-wide layers)
never learned to tell the shapes apart (colours and counts 100%, shapes 2%, overall 0.56 after 5000 steps); what the
demo has to show is the multimodal path and Seer on top of it, not a harder vision problem. Prompts are `"<image> <task>"` (the tokenizer adds BOS in front and `=` behind):
  colors   -> the colours, left to right          (1-4 tokens)
  shapes   -> the shapes, left to right           (1-4 tokens)
  describe -> colour and shape of each, left to right (2-8 tokens)
  count    -> how many shapes there are           (1 token)
then EOS to the end of the response, as LLaDA's SFT data is padded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from seer_deploy.models.demos.demo_tasks import write_word_level_tokenizer

IMAGE_SIZE = 64
COLUMNS = 4  # one shape per 16-pixel column at most, so "left to right" is unambiguous
COLUMN_WIDTH = IMAGE_SIZE // COLUMNS
CELL = COLUMN_WIDTH  # shapes sit inside one CELL x CELL square
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (240, 220, 40),
    "magenta": (220, 50, 220),
    "cyan": (40, 210, 220),
}
SHAPES: tuple[str, ...] = ("square", "circle", "triangle")
TASKS: tuple[str, ...] = ("colors", "shapes", "describe", "count")
SPECIALS: list[str] = ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "=", "<image>"]
VOCAB: list[str] = SPECIALS + [str(d) for d in range(10)] + list(COLOURS) + list(SHAPES) + list(TASKS)
SHAPE_SIZE = 12  # pixels, centred in its cell
MAX_OBJECTS = COLUMNS
MAX_ANSWER_TOKENS = 2 * MAX_OBJECTS
HELDOUT_SEED = 20_261_203  # held-out pictures; training streams from other seeds


@dataclass(frozen=True)
class Shape:
    colour: str
    kind: str
    column: int  # 0..COLUMNS-1, left to right
    x_offset: int  # pixels from the column's left edge
    y: int  # top pixel row
    size: int  # side of the bounding box in pixels
    tint: tuple[int, int, int]  # small per-shape colour jitter, so colours are ranges, not exact values


@dataclass(frozen=True)
class PictureExample:
    task: str
    shapes: tuple[Shape, ...]  # sorted by column

    @property
    def prompt(self) -> str:
        return f"<image> {self.task}"

    @property
    def answer(self) -> str:
        return solve(self.task, self.shapes)

    def image(self) -> Image.Image:
        return render(self.shapes)


def solve(task: str, shapes: tuple[Shape, ...]) -> str:
    if task == "colors":
        return " ".join(s.colour for s in shapes)
    if task == "shapes":
        return " ".join(s.kind for s in shapes)
    if task == "describe":
        return " ".join(f"{s.colour} {s.kind}" for s in shapes)
    if task == "count":
        return str(len(shapes))
    raise ValueError(f"unknown demo-vl task '{task}'; choose one of {', '.join(TASKS)}")


def _mask(kind: str, size: int) -> np.ndarray:
    """Boolean [size, size] footprint of a shape."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    if kind == "square":
        return np.ones((size, size), dtype=bool)
    if kind == "circle":
        c = size / 2
        return (yy - c) ** 2 + (xx - c) ** 2 <= c * c
    if kind == "triangle":  # apex up: row r (from the top) is (r + 1) / size of the base wide
        half = (yy / size) * (size / 2)
        return np.abs(xx - size / 2) <= half + 0.25
    raise ValueError(f"unknown shape '{kind}'")


def render(shapes: tuple[Shape, ...]) -> Image.Image:
    """The picture: black background, each shape filled with its colour plus tint."""
    canvas = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for s in shapes:
        x0 = s.column * COLUMN_WIDTH + s.x_offset
        colour = np.clip(np.asarray(COLOURS[s.colour]) + np.asarray(s.tint), 0, 255).astype(np.uint8)
        region = canvas[s.y : s.y + s.size, x0 : x0 + s.size]
        region[_mask(s.kind, s.size)] = colour
    return Image.fromarray(canvas, mode="RGB")


def sample_shapes(rng: random.Random, n: int | None = None) -> tuple[Shape, ...]:
    n = n if n is not None else rng.randint(1, MAX_OBJECTS)
    columns = sorted(rng.sample(range(COLUMNS), n))
    out = []
    inset = (CELL - SHAPE_SIZE) // 2
    for col in columns:
        out.append(
            Shape(
                colour=rng.choice(list(COLOURS)),
                kind=rng.choice(SHAPES),
                column=col,
                x_offset=inset,
                y=rng.randrange(0, IMAGE_SIZE, CELL) + inset,
                size=SHAPE_SIZE,
                tint=(rng.randint(-15, 15), rng.randint(-15, 15), rng.randint(-15, 15)),
            )
        )
    return tuple(out)


def sample_example(rng: random.Random, task: str | None = None) -> PictureExample:
    return PictureExample(task or rng.choice(TASKS), sample_shapes(rng))


def heldout_examples(n: int, seed: int = HELDOUT_SEED) -> list[PictureExample]:
    """Held-out pictures: a fixed seed that training never uses, tasks in rotation."""
    rng = random.Random(seed)
    return [sample_example(rng, TASKS[i % len(TASKS)]) for i in range(n)]


def write_tokenizer(path: Path) -> None:
    """The demo's tokenizer.json: one token per word or digit, `<image>` special, BOS in front and '=' behind."""
    write_word_level_tokenizer(path, VOCAB, SPECIALS, fuse_decoder=False)
