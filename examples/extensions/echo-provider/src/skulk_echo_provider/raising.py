"""The entry point `echo-raising`: an extension whose import raises (skipped at load, logged)."""

raise RuntimeError("echo-raising is broken on purpose: its import raises")
