"""Skulk video engines: ComfyUI (a managed loopback server) and the deterministic test video engine."""
