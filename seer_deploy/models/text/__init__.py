"""Tokenizers as checkpoints ship them and the checkpoint's own chat template."""
