"""Skulk's node hardware facts, the backend tags derived from them, and the node doctor."""
