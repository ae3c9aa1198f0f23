"""A third-party plugin, installed with plain pip, is loaded by a real node from a user profile.

`tests/thirdparty/skulk-hello` is written the way an outside author would write it. This module
pip-installs it into the running environment (and uninstalls it afterwards), then checks that
`skulk-kernel plugins` lists it, that it passes the plugin conformance suite, and that a real node
started from a user profile naming it runs its hooks: an engine, a start-up marker in the node's
home, GET /hello, and the shutdown marker.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from skulk_testing.conformance import PluginConformance
from skulk_testing.nodes import NodeProcess

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)
HELLO = Path(__file__).resolve().parents[2] / "tests" / "thirdparty" / "skulk-hello"


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed_hello() -> Iterator[float]:
    """pip install the plugin (no deps: skulk-kernel is already here); yields the install time."""
    if pip("show", "skulk-hello").returncode == 0:
        pip("uninstall", "-y", "skulk-hello")  # left over from an interrupted run
    # With hatchling in the environment the build needs no network; otherwise pip fetches it.
    isolation = [] if importlib.util.find_spec("hatchling") is None else ["--no-build-isolation"]
    started = time.monotonic()
    result = pip("install", "--no-deps", "--no-input", *isolation, str(HELLO))
    took = time.monotonic() - started
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    how = "no build isolation" if isolation else "isolated build"
    log.warning("pip install of skulk-hello took %.1fs (%s)", took, how)
    importlib.invalidate_caches()
    try:
        yield took
    finally:
        removed = pip("uninstall", "-y", "skulk-hello")
        assert removed.returncode == 0, removed.stderr
        for name in [m for m in sys.modules if m == "skulk_hello" or m.startswith("skulk_hello.")]:
            del sys.modules[name]
        importlib.invalidate_caches()


def test_pip_installed_plugin_is_listed(installed_hello: float) -> None:
    from skulk_kernel.plugins import installed_plugins

    info = installed_plugins()["hello-world"]
    assert (info.distribution, info.version, info.module) == ("skulk-hello", "0.1.0", "skulk_hello.plugin")
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "plugins"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    line = next(line for line in out.splitlines() if line.split()[:1] == ["hello-world"])
    assert "skulk-hello 0.1.0" in line and "INCOMPATIBLE" not in line
    assert installed_hello < 240


class TestHelloPlugin(PluginConformance):
    plugin_name = "hello-world"
    hook_owners = ("api-control",)  # it implements register_api_routes

    @pytest.fixture(autouse=True)
    def _installed(self, installed_hello: float) -> None:
        pass


def test_node_runs_the_third_party_plugin(
    installed_hello: float, tmp_path: Path, node_factory: Callable[..., NodeProcess]
) -> None:
    profile = tmp_path / "hello.toml"
    profile.write_text(
        "[profile]\n"
        'name = "hello"\n'
        'description = "engine-echo plus a third-party plugin"\n'
        'plugins = ["engine-echo", "hello-world", "api-control"]\n'
        "\n"
        "[plugins.hello-world]\n"
        'greeting = "Howdy"\n'
    )
    shown = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "profile", "show", str(profile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "hello-world" in shown.stdout and "skulk-hello 0.1.0 (ok)" in shown.stdout

    node = node_factory(str(profile)).wait_api(timeout=60)
    started = node.home / "hello-world.started"
    node.wait_until(started.exists, 30, "the startup marker")
    marker = json.loads(started.read_text())
    node_id = node.get("/node_id").json()
    assert marker["nodeId"] == node_id
    assert marker["greeting"] == "Howdy"  # [plugins.hello-world] was validated and handed over
    assert marker["engines"] == ["echo", "hello"]
    assert marker["plugins"] == ["engine-echo", "hello-world", "api-control"]

    hello = node.get("/hello")
    assert hello.status_code == 200
    assert hello.json() == {"greeting": "Howdy, world", "nodeId": node_id, "engines": ["echo", "hello"]}

    node.stop()
    assert node.proc is not None and node.proc.returncode is not None
    assert (node.home / "hello-world.stopped").read_text() == node_id
    text = node.log()
    assert "raised in hook" not in text and "Traceback" not in text, text[-3000:]


def test_exactly_one_copy_is_installed(installed_hello: Any) -> None:
    """The fixture uninstalls it again in teardown (and clears a copy a killed run left behind)."""
    from importlib import metadata

    dists = [d for d in metadata.distributions() if d.metadata["Name"] == "skulk-hello"]
    assert len(dists) == 1
