"""Test support for Skulk and its plugins (installed as a pytest plugin)."""
