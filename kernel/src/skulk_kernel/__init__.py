"""Skulk kernel: State, apply(), the event and command types, hookspecs, contracts and loading.

Plugin authors import `hookimpl` from here.
"""

from .hookspecs import hookimpl, hookspec

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl", "hookspec"]
