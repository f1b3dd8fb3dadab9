"""The decoding rules' names, with no library behind them: what the CLI's option groups offer (their `--help` loads
no numpy) and what `core.decoding` / `core.generation` check against."""

from __future__ import annotations

LLADA_REMASKING = ("low_confidence", "random")
DREAM_REMASKING = ("origin", "maskgit_plus", "topk_margin", "entropy")
LLADA_DECODES = ("fixed", "threshold", "factor")
DREAM_DECODES = ("timesteps", "confident")
REMASKING_CHOICES = (*LLADA_REMASKING, *DREAM_REMASKING)
DECODE_CHOICES = (*LLADA_DECODES, *DREAM_DECODES)
