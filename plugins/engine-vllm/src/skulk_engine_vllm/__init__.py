"""Skulk's vLLM engine: a managed vLLM OpenAI-compatible server per instance, in its own venv."""
