"""Fixtures every Skulk test suite gets once skulk-testing is installed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

# The conformance suites are plain asserts in an installed package: have pytest rewrite them so a
# failing plugin gets the same detailed message as a failing test of its own.
pytest.register_assert_rewrite("skulk_testing.conformance")

from .isolation import isolate_this_process  # noqa: E402
from .nodes import NodeProcess, start_node  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Each test process (xdist controller and workers alike) gets a cluster secret of its own, so
    nodes started by parallel workers never join each other (skulk_testing.isolation)."""
    isolate_this_process()


@pytest.fixture(scope="session")
def shared_echo_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One echo-engine node for the whole run (every plugin of `echo_node.ALL_PLUGINS`, serving
    `ECHO` and `EMBED`), for suites that only read: requests, listings, errors. A suite that changes
    what the node holds or how it is configured starts its own with `echo_node(...)`. Under xdist
    each worker has its own session: the repository's conftest.py sends every module that uses this
    fixture to one worker, so the node starts once per run."""
    from .echo_node import ECHO, EMBED, echo_node

    with echo_node(tmp_path_factory.mktemp("shared-echo"), [ECHO, EMBED], name="shared-echo") as proc:
        yield proc


@pytest.fixture
def plugin_manager() -> pluggy.PluginManager:
    """A fresh plugin manager with the kernel's hookspecs and defaults, nothing else."""
    from skulk_kernel.api import new_plugin_manager

    return new_plugin_manager()


@pytest.fixture
def register_plugin(plugin_manager: pluggy.PluginManager) -> Iterator[Callable[[Any, str], None]]:
    """Register a plugin object (module, class instance) for the duration of one test."""
    from skulk_kernel.api import register_plugin as _register

    names: list[str] = []

    def register(plugin: Any, name: str = "test-plugin") -> None:
        _register(plugin_manager, plugin, name)
        names.append(name)

    yield register
    for name in names:
        if plugin_manager.has_plugin(name):
            plugin_manager.unregister(name=name)


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Start real `skulk-kernel run` processes; every one is stopped (killed if need be) after the test."""
    started: list[NodeProcess] = []

    def factory(profile: str, *args: str, **kwargs: Any) -> NodeProcess:
        kwargs.setdefault("home", tmp_path / f"node{len(started)}")
        node = start_node(profile, *args, **kwargs)
        started.append(node)
        return node

    yield factory
    for node in started:
        node.stop()


@pytest.fixture
def fake_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Install a plugin for one test: a dist-info (and module) in tmp_path, put on sys.path.

    Arguments as `skulk_testing.distributions.write_plugin_dist` (less `root`); returns the folder.
    """
    from .distributions import write_plugin_dist

    def make(distribution: str, version: str = "0.1.0", **kwargs: Any) -> Path:
        root = write_plugin_dist(tmp_path / "site" / distribution, distribution, version, **kwargs)
        monkeypatch.syspath_prepend(str(root))
        return root

    return make
