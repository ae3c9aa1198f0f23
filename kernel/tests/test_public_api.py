"""The seams between the kernel and its plugins, checked on the source of every plugin.

Plugins import the kernel only through `skulk_kernel` (hookimpl) and `skulk_kernel.api`, never an
underscore name, and see the node as `NodeSurface`, never `Any`. A wrapper hookimpl is refused at
load with the plugin's and the hook's names.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from skulk_kernel import api, hookimpl
from skulk_kernel.node import Node
from skulk_kernel.plugins import PluginLoadError, new_plugin_manager, register_plugin

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = sorted(p for p in (ROOT / "plugins").glob("*/src/**/*.py"))


def kernel_imports(path: Path) -> list[tuple[str, list[str]]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("skulk_kernel"):
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("skulk_kernel")]
    return found


def test_there_are_plugin_sources_to_check() -> None:
    assert len(PLUGIN_SOURCES) > 40


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_plugins_import_only_the_public_api(path: Path) -> None:
    for module, names in kernel_imports(path):
        assert module in ("skulk_kernel", "skulk_kernel.api"), f"{path.name} imports {module}"
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{path.name} imports private kernel names {private}"
        if module == "skulk_kernel":
            assert set(names) <= {"hookimpl", "hookspec", "api"}, f"{path.name} imports {names} from skulk_kernel"


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: str(p.relative_to(ROOT / "plugins")))
def test_plugins_never_type_the_node_as_any(path: Path) -> None:
    assert not re.search(r"\bnode: (Any|object)\b", path.read_text()), f"{path.name} types a node as Any"


def test_node_implements_the_surface_it_promises() -> None:
    missing = [
        name
        for name in dir(api.NodeSurface)
        if not name.startswith("_") and not hasattr(Node, name) and name not in Node.__init__.__code__.co_names
    ]
    assert not missing, f"Node lacks {missing} of NodeSurface"


def test_every_public_name_resolves() -> None:
    assert "NodeSurface" in api.__all__ and "decide" in api.__all__
    assert all(not name.startswith("_") for name in api.__all__)
    for name in api.__all__:
        assert getattr(api, name) is not None


class WrapperPlugin:
    @hookimpl(wrapper=True)
    def startup(self, node: api.NodeSurface) -> object:
        return (yield)


class OldStyleWrapperPlugin:
    @hookimpl(hookwrapper=True)
    def shutdown(self, node: api.NodeSurface) -> object:
        yield


@pytest.mark.parametrize(("plugin", "hook"), [(WrapperPlugin(), "startup"), (OldStyleWrapperPlugin(), "shutdown")])
def test_a_wrapper_hookimpl_is_refused_at_load_naming_plugin_and_hook(plugin: object, hook: str) -> None:
    pm = new_plugin_manager()
    with pytest.raises(PluginLoadError, match=rf"plugin 'wrapping' implements hook {hook} as a wrapper"):
        register_plugin(pm, plugin, "wrapping")
    assert pm.get_plugin("wrapping") is None
