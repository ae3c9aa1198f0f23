"""The echo engine: Skulk's deterministic reference engine and the worked example for plugin authors."""
