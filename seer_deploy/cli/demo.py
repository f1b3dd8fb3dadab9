"""`seer-deploy demo`: the bundled demo model end to end."""

from __future__ import annotations

import time

import click

DEMO_PROMPTS = ("reverse 8675309", "sort 31415926535", "filter 9081726354", "double 4711", "count 12345678901234")


@click.command("demo")
@click.option("--gen-length", type=int, default=64, show_default=True, help="Response slots to fill.")
def command(gen_length: int) -> None:
    """Load the bundled demo checkpoint and answer a few built-in prompts."""
    from seer_deploy.models import Tokenizer, load_checkpoint
    from seer_deploy.models.demo_tasks import solve
    from seer_deploy.runtime.reference import GenerationConfig, generate

    ckpt = load_checkpoint("demo")
    tok = Tokenizer.from_checkpoint(ckpt.path, ckpt.config.eos_id)
    click.echo(f"demo checkpoint: {ckpt.path} ({ckpt.model.num_parameters() / 1e6:.2f}M parameters, {ckpt.layout} layout)")
    start = time.perf_counter()
    result = generate(ckpt.model, [tok.encode_prompt(p) for p in DEMO_PROMPTS], GenerationConfig(gen_length, gen_length))
    seconds = time.perf_counter() - start
    for prompt, row in zip(DEMO_PROMPTS, result.tokens, strict=True):
        answer = tok.decode_answer(row.tolist())
        task, digits = prompt.split()
        mark = "ok" if answer == solve(task, digits) else f"expected {solve(task, digits)}"
        click.echo(f"  {prompt:28s} -> {answer:24s} [{mark}]")
    click.echo(f"{len(DEMO_PROMPTS)} prompts, gen_length {gen_length}: {result.steps_run} steps, "
               f"{result.tokens_processed} tokens processed, {seconds:.2f}s (torch reference loop)")
