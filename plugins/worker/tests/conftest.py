from __future__ import annotations

from pathlib import Path

import pytest

PROFILE = """
[profile]
name = "worker-test"
plugins = ["master", "worker", "engine-echo", "store", "api-control", "api-openai"]

[plugins.master]
default_models = ["skulk/echo"]

[plugins.worker]
max_restarts = {max_restarts}
restart_backoff_s = 0.2
"""


@pytest.fixture
def echo_profile(tmp_path: Path):
    def make(max_restarts: int = 3) -> str:
        path = tmp_path / "profile.toml"
        path.write_text(PROFILE.format(max_restarts=max_restarts))
        return str(path)

    return make
