"""Checkpoint directories: finding them, reading their files and weights, writing them as they ship."""
