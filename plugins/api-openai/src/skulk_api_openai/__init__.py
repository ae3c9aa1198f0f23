"""Skulk's OpenAI-compatible inference API (chat completions, embeddings, models)."""
