"""Skulk image engine on diffusers (see README.md)."""
