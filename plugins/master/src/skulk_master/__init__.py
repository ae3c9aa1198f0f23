"""Skulk's master role."""
