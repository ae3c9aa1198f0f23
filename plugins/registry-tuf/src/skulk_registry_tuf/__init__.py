"""Skulk's signed model-card registry: card files verified with TUF join the node's catalog."""
