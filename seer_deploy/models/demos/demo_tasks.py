"""The demo's synthetic tasks: digit strings in, answers of content-dependent length out.

Prompt text is `"<task> <digits>"` (the demo tokenizer adds BOS in front and `=` behind); the answer is a digit
string from 1 to 40 tokens, then EOS to the end of the response, as LLaDA's SFT data is padded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

# Token strings of the demo vocabulary, in id order.
DIGITS = [str(d) for d in range(10)]
TASKS = ("reverse", "sort", "filter", "double", "count")
VOCAB: list[str] = DIGITS + ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "="] + list(TASKS)
MAX_DIGITS = {"reverse": 24, "sort": 24, "filter": 32, "double": 20, "count": 30}
MAX_PROMPT_TOKENS = 3 + max(MAX_DIGITS.values())  # BOS, task, digits, '='
MAX_ANSWER_TOKENS = 40
HELDOUT_SEED = 20_261_202  # held-out prompts; training streams from other seeds


@dataclass(frozen=True)
class Example:
    task: str
    digits: str

    @property
    def prompt(self) -> str:
        return f"{self.task} {self.digits}"

    @property
    def answer(self) -> str:
        return solve(self.task, self.digits)


def solve(task: str, digits: str) -> str:
    if task == "reverse":
        return digits[::-1]
    if task == "sort":
        return "".join(sorted(digits))
    if task == "filter":  # the digits below 5, in order
        return "".join(d for d in digits if d < "5")
    if task == "double":  # the string written twice
        return digits + digits
    if task == "count":  # how many digits there are
        return str(len(digits))
    raise ValueError(f"unknown demo task '{task}'; choose one of {', '.join(TASKS)}")


def sample_example(rng: random.Random, task: str | None = None) -> Example:
    task = task or rng.choice(TASKS)
    n = rng.randint(1, MAX_DIGITS[task])
    digits = "".join(rng.choice(DIGITS) for _ in range(n))
    if task == "filter" and not any(d < "5" for d in digits):  # answers are never empty
        pos = rng.randrange(n)
        digits = digits[:pos] + rng.choice(DIGITS[:5]) + digits[pos + 1 :]
    return Example(task, digits)


def heldout_examples(n: int, seed: int = HELDOUT_SEED) -> list[Example]:
    """Held-out prompts: a fixed seed that training never uses, tasks in rotation."""
    rng = random.Random(seed)
    return [sample_example(rng, TASKS[i % len(TASKS)]) for i in range(n)]


def write_word_level_tokenizer(path: Path, vocab: list[str], specials: list[str], fuse_decoder: bool) -> None:
    """A demo's tokenizer.json: one token per word or digit, BOS in front and '=' behind a prompt (fuse_decoder: the
    answer's tokens are joined without spaces)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    ids = {tok: i for i, tok in enumerate(vocab)}
    tok = Tokenizer(WordLevel(ids, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A =",
        special_tokens=[("<|startoftext|>", ids["<|startoftext|>"]), ("=", ids["="])],
    )
    if fuse_decoder:
        tok.decoder = decoders.Fuse()
    tok.save(str(path))


def write_tokenizer(path: Path) -> None:
    """The demo's tokenizer.json: one token per digit, words for tasks; answers decode as one word."""
    write_word_level_tokenizer(path, VOCAB, ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "="], fuse_decoder=True)
