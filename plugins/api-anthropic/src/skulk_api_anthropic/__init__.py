"""Skulk's Anthropic-compatible inference API (Messages, count_tokens, models)."""
