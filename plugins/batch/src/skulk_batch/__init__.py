"""Skulk's OpenAI Batch API plugin (see README.md)."""
