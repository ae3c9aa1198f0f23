"""Skulk's worker role."""
