"""Skulk's Ollama-compatible inference API (/api/* and /ollama/api/*)."""
