"""Prompts as requests arrive: the text, the pictures its placeholders stand for, the image table."""
