"""Skulk's model store."""
