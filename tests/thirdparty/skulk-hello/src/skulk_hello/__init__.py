"""skulk-hello: a third-party Skulk plugin (a tiny engine, lifecycle markers, GET /hello)."""

__version__ = "0.1.0"
