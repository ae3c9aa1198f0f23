"""Skulk media jobs: long renders as jobs on the API host (the /v1/videos routes)."""
