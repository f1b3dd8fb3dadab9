"""The one generation service (being written)."""
