"""Tokenizers from tokenizer.json: the demo's, and LLaDA-Instruct's chat template when header tokens exist."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from seer_deploy.core.errors import CheckpointError, ConfigError
from seer_deploy.models.demos.demo_tasks import VOCAB, write_tokenizer
from seer_deploy.models.text.tokenizer import Tokenizer, check_prompt, special_ids_from_tokenizer_file


def test_demo_tokenizer_round_trip(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tokenizer.json")
    ids = special_ids_from_tokenizer_file(tmp_path / "tokenizer.json")
    assert ids == {"mask": VOCAB.index("<|mdm_mask|>"), "eos": VOCAB.index("<|endoftext|>"),
                   "bos": VOCAB.index("<|startoftext|>"), "text_tokens": len(VOCAB)}
    tok = Tokenizer(tmp_path / "tokenizer.json", eos_id=ids["eos"])
    prompt = tok.encode_prompt("reverse 3141")
    assert [VOCAB[i] for i in prompt] == ["<|startoftext|>", "reverse", "3", "1", "4", "1", "="]
    answer = [VOCAB.index(c) for c in "1413"] + [ids["eos"], VOCAB.index("7")]
    assert tok.decode_answer(answer) == "1413"  # stops at the first EOS


def test_chat_template_for_instruct_tokenizers(tmp_path: Path) -> None:
    specials = ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|start_header_id|>",
                "<|end_header_id|>"]
    vocab = {t: i for i, t in enumerate(specials + ["user", "assistant", "hi", "\n\n"])}
    hf = HFTokenizer(WordLevel(vocab, unk_token="<|endoftext|>"))
    hf.pre_tokenizer = Whitespace()
    hf.add_special_tokens(specials)
    hf.save(str(tmp_path / "tokenizer.json"))
    ids = special_ids_from_tokenizer_file(tmp_path / "tokenizer.json")
    assert ids["eot"] == vocab["<|eot_id|>"]
    tok = Tokenizer(tmp_path / "tokenizer.json", eos_id=ids["eos"], eot_id=ids["eot"])
    assert tok.chat
    ids_out = tok.encode_prompt("hi")
    assert ids_out[0] == vocab["<|startoftext|>"]
    assert vocab["<|eot_id|>"] in ids_out and ids_out.count(vocab["<|start_header_id|>"]) == 2
    assert tok.decode_answer([vocab["hi"], vocab["<|eot_id|>"], vocab["hi"]]) == "hi"


def test_missing_or_broken_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="tokenizer.json is missing"):
        Tokenizer(tmp_path / "tokenizer.json", eos_id=0)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a readable tokenizer.json"):
        Tokenizer(tmp_path / "tokenizer.json", eos_id=0)


def test_non_utf8_tokenizer_is_named(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(b'{"model": "\xc3"}')
    with pytest.raises(CheckpointError, match=r"tokenizer.json is not UTF-8 text \(byte 0xc3 at offset 11\)"):
        Tokenizer(tmp_path / "tokenizer.json", eos_id=0)


@pytest.mark.parametrize(
    "prompt, message",
    [
        (None, "the prompt is null, not text"),
        ({"prompt": "x"}, "the prompt is an object, not text"),
        (["reverse 1"], "the prompt is a list, not text"),
        (42, "the prompt is a number, not text"),
        ("", "the prompt is empty"),
        ("  \n\t ", "the prompt is empty"),
        ("reverse 1<|mdm_mask|>", r"contains '<\|mdm_mask\|>', the model's mask token"),
        ("sort <|endoftext|> 12", r"contains '<\|endoftext\|>', the model's eos token"),
        ("<|startoftext|>count 1", r"'<\|startoftext\|>', the model's bos token"),
        ("hi<|eot_id|>", "eot token"),
        ("<|start_header_id|>system", "chat-template header token"),
        ("bad \ud800 text", "not valid Unicode"),
    ],
)
def test_unusable_prompts_are_refused_with_the_reason(tmp_path: Path, prompt: object, message: str) -> None:
    write_tokenizer(tmp_path / "tokenizer.json")
    tok = Tokenizer(tmp_path / "tokenizer.json", eos_id=VOCAB.index("<|endoftext|>"))
    with pytest.raises(ConfigError, match=message):
        tok.encode_prompt(prompt)  # type: ignore[arg-type]


def test_ordinary_text_with_special_looking_pieces_is_kept(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tokenizer.json")
    tok = Tokenizer(tmp_path / "tokenizer.json", eos_id=VOCAB.index("<|endoftext|>"))
    assert tok.encode_prompt("double 12 <|mdm mask|> = 24")[0] == VOCAB.index("<|startoftext|>")
    assert check_prompt(" reverse 1 ") == " reverse 1 "
