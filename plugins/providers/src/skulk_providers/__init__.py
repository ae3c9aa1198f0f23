"""skulk-providers: extensions (stevedore) that offer capabilities to the cluster."""

__version__ = "0.1.0"
