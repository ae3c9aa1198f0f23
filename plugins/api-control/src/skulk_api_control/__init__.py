"""Skulk's HTTP host and control API."""
