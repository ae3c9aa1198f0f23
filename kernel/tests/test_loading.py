"""Plugin loading: kernel ranges, missing plugins, duplicate names, guarded hooks, hook tracing.

Plugins are "installed" with a dist-info folder on sys.path (the `fake_plugin` fixture), so the
tests see exactly what importlib.metadata would see after `pip install`, without pip.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pluggy
import pytest
from skulk_testing.recording import HookBoom, RecordingPlugin

from skulk_kernel import hookimpl
from skulk_kernel.events import IndexedEvent, NodeJoined
from skulk_kernel.hooks import GuardedHooks
from skulk_kernel.node import Node, NodeError, NodeOptions, collect
from skulk_kernel.plugins import (
    PluginLoadError,
    build_plugin_manager,
    install_hint,
    installed_plugins,
    kernel_version,
    new_plugin_manager,
    register_plugin,
)
from skulk_kernel.profiles import Profile, load_profile
from skulk_kernel.telemetry import NodeResources

PLUGIN_SOURCE = """
from skulk_kernel import hookimpl

@hookimpl
def probe_node(facts):
    facts["{name}"] = True
"""


def profile_of(*plugins: str, name: str = "test") -> Profile:
    return Profile(name=name, plugins=plugins)


# ============================== kernel range =====================================================


def test_plugin_for_another_kernel_is_refused_naming_both_versions(fake_plugin: Any) -> None:
    fake_plugin(
        "skulk-engine-future",
        "3.0.0",
        plugin="engine-future",
        module="skulk_fake_future",
        requires=["skulk-kernel>=9,<10", "numpy>=1"],
        module_source=PLUGIN_SOURCE.format(name="future"),
    )
    info = installed_plugins()["engine-future"]
    assert info.version == "3.0.0" and info.kernel_range in ("<10,>=9", ">=9,<10")
    assert not info.kernel_compatible(kernel_version())

    with pytest.raises(PluginLoadError) as raised:
        build_plugin_manager(profile_of("engine-future"))
    message = str(raised.value)
    assert "engine-future" in message and "skulk-engine-future 3.0.0" in message
    assert "skulk-kernel" in message and ">=9" in message and "<10" in message
    assert f"running kernel is {kernel_version()}" in message
    assert "skulk_fake_future" not in sys.modules  # refused before import


def test_plugin_within_the_kernel_range_loads(fake_plugin: Any) -> None:
    fake_plugin(
        "skulk-engine-present",
        "0.1.3",
        plugin="engine-present",
        module="skulk_fake_present",
        requires=[f"skulk-kernel>={kernel_version()}"],
        module_source=PLUGIN_SOURCE.format(name="present"),
    )
    pm = build_plugin_manager(profile_of("engine-present"))
    assert pm.has_plugin("engine-present")
    facts: dict[str, Any] = {}
    pm.hook.probe_node(facts=facts)
    assert facts == {"present": True}


def test_plugin_without_a_kernel_requirement_is_accepted(fake_plugin: Any) -> None:
    fake_plugin(
        "skulk-any-kernel",
        plugin="any-kernel",
        module="skulk_fake_any",
        requires=[],
        module_source=PLUGIN_SOURCE.format(name="any"),
    )
    assert installed_plugins()["any-kernel"].kernel_range == ""
    assert build_plugin_manager(profile_of("any-kernel")).has_plugin("any-kernel")


def test_plugin_that_fails_to_import_is_named(fake_plugin: Any) -> None:
    fake_plugin(
        "skulk-broken",
        plugin="broken",
        module="skulk_fake_broken",
        module_source="import a_module_that_does_not_exist_anywhere\n",
    )
    with pytest.raises(PluginLoadError, match=r"plugin 'broken' failed to import.*a_module_that"):
        build_plugin_manager(profile_of("broken"))


def test_misspelled_hook_is_a_load_error_naming_the_plugin(fake_plugin: Any) -> None:
    fake_plugin(
        "skulk-typo",
        plugin="engine-typo",
        module="skulk_fake_typo",
        module_source="from skulk_kernel import hookimpl\n\n@hookimpl\ndef probe_nodes(facts):\n    pass\n",
    )
    with pytest.raises(PluginLoadError, match=r"plugin 'engine-typo'.*unknown hook 'probe_nodes'"):
        build_plugin_manager(profile_of("engine-typo"))


def test_hookimpl_with_unknown_argument_is_a_load_error(fake_plugin: Any) -> None:
    fake_plugin(
        "skulk-badargs",
        plugin="engine-badargs",
        module="skulk_fake_badargs",
        module_source="from skulk_kernel import hookimpl\n\n@hookimpl\ndef probe_node(facts, weather):\n    pass\n",
    )
    with pytest.raises(PluginLoadError, match=r"(?s)plugin 'engine-badargs' \(skulk-badargs\).*weather"):
        build_plugin_manager(profile_of("engine-badargs"))


def test_only_the_profiles_plugins_are_loaded(fake_plugin: Any) -> None:
    fake_plugin(
        "skulk-unused", plugin="unused", module="skulk_fake_unused", module_source=PLUGIN_SOURCE.format(name="unused")
    )
    pm = build_plugin_manager(profile_of("engine-echo"))
    assert "skulk_fake_unused" not in sys.modules
    assert [n for n, _ in pm.list_name_plugin()] == ["kernel-defaults", "engine-echo"]


# ============================== plugin-owned hookspecs (add_hookspecs) ===========================

OWNER_SPECS = """
from skulk_kernel.hookspecs import hookspec


@hookspec
def greet(name):
    \"\"\"Say hello to `name`.\"\"\"
"""

OWNER_SOURCE = """
from skulk_kernel import hookimpl

import skulk_fake_greet_specs_{tag} as specs


@hookimpl
def add_hookspecs(pm):
    pm.add_hookspecs(specs)


@hookimpl
def greet(name):  # the owner implements its own new hook too
    return "owner:" + name
"""

CONSUMER_SOURCE = """
from skulk_kernel import hookimpl


@hookimpl
def greet({args}):
    return "{plugin}:" + name
"""


def install_greeters(fake_plugin: Any, tag: str, *, clash: bool = False, consumer_args: str = "name") -> None:
    """greet-owner adds the `greet` spec; greet-before and greet-after implement it. Module names
    carry `tag`: a module imported by one test stays in sys.modules for the next."""
    specs = OWNER_SPECS.replace("def greet(", "def probe_node(") if clash else OWNER_SPECS
    root = fake_plugin(
        "skulk-greet-owner",
        plugin="greet-owner",
        module=f"skulk_fake_greet_owner_{tag}",
        module_source=OWNER_SOURCE.replace("{tag}", tag),
    )
    (root / f"skulk_fake_greet_specs_{tag}.py").write_text(specs)
    for who in ("before", "after"):
        fake_plugin(
            f"skulk-greet-{who}",
            plugin=f"greet-{who}",
            module=f"skulk_fake_greet_{who}_{tag}",
            module_source=CONSUMER_SOURCE.format(plugin=who, args=consumer_args),
        )


def test_a_plugin_adds_hookspecs_that_plugins_loaded_before_and_after_implement(fake_plugin: Any) -> None:
    install_greeters(fake_plugin, "order")
    pm = build_plugin_manager(profile_of("greet-before", "greet-owner", "greet-after", "engine-echo"))
    assert pm.hook.greet.spec is not None and pm.hook.greet.spec.namespace.__name__ == "skulk_fake_greet_specs_order"
    assert sorted(pm.hook.greet(name="x")) == ["after:x", "before:x", "owner:x"]
    assert [kwargs for kwargs, _ in pm.hook.add_hookspecs._call_history or ()] == [{"pm": pm}]  # called once


def test_a_hookimpl_that_does_not_fit_a_plugin_added_spec_names_its_plugin(fake_plugin: Any) -> None:
    install_greeters(fake_plugin, "args", consumer_args="name, weather")
    with pytest.raises(PluginLoadError, match=r"(?s)plugin 'greet-before'.*weather"):
        build_plugin_manager(profile_of("greet-before", "greet-owner"))


def test_a_plugin_redeclaring_a_loaded_hook_is_a_load_error_naming_it(fake_plugin: Any) -> None:
    install_greeters(fake_plugin, "clash", clash=True)
    with pytest.raises(PluginLoadError, match=r"plugin 'greet-owner'.*add_hookspecs.*probe_node"):
        build_plugin_manager(profile_of("greet-owner"))


def test_a_hook_of_a_plugin_that_is_not_loaded_is_logged_not_a_crash(
    fake_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    install_greeters(fake_plugin, "alone")
    with caplog.at_level(logging.DEBUG, logger="skulk.plugins"):
        pm = build_plugin_manager(profile_of("greet-before", "engine-echo"))
    assert "plugin 'greet-before' implements hook 'greet', which no loaded plugin declares" in caplog.text
    assert pm.hook.greet.spec is None  # never called by anyone: its owner is not loaded


# ============================== missing plugins ==================================================


def test_missing_plugin_gives_the_install_command() -> None:
    with pytest.raises(PluginLoadError) as raised:
        build_plugin_manager(profile_of("engine-echo", "engine-nowhere", name="wants-nowhere"))
    message = str(raised.value)
    assert "'wants-nowhere'" in message and "'engine-nowhere'" in message
    assert "pip install skulk-engine-nowhere" in message


def test_install_hint_points_at_the_workspace_folder_when_there_is_one() -> None:
    folder = Path(__file__).resolve().parents[2] / "plugins" / "engine-echo"
    assert install_hint("engine-echo") == f"pip install -e {folder}"
    assert install_hint("speech-nowhere") == "pip install skulk-speech-nowhere"


# ============================== duplicate names ==================================================


class _Engine:
    tasks = frozenset({"TextGeneration"})
    dispatch_width = 1

    def __init__(self, name: str) -> None:
        self.name = name


class EnginePlugin:
    def __init__(self, *names: str) -> None:
        self.names = names

    @hookimpl
    def register_engines(self, register: Any) -> None:
        for name in self.names:
            register(_Engine(name))


def test_duplicate_engine_names_name_both_plugins(plugin_manager: pluggy.PluginManager, register_plugin: Any) -> None:
    register_plugin(EnginePlugin("echo2", "shared"), "engine-one")
    register_plugin(EnginePlugin("shared"), "engine-two")
    with pytest.raises(NodeError) as raised:
        collect(plugin_manager, "register_engines", "engine")
    message = str(raised.value)
    assert "engine 'shared'" in message
    assert "'engine-one'" in message and "'engine-two'" in message


def test_duplicate_engine_name_with_a_real_plugin_stops_the_node(tmp_path: Path) -> None:
    pm = build_plugin_manager(profile_of("engine-echo"))
    register_plugin(pm, EnginePlugin("echo"), "engine-impostor")
    both = r"'(engine-echo|engine-impostor)'"
    with pytest.raises(NodeError, match=rf"engine 'echo' is registered by both {both} and {both}"):
        Node(profile_of("engine-echo"), NodeOptions(home=tmp_path), pm=pm)


def test_distinct_engine_names_are_all_collected(plugin_manager: pluggy.PluginManager, register_plugin: Any) -> None:
    register_plugin(EnginePlugin("a", "b"), "engine-ab")
    register_plugin(EnginePlugin("c"), "engine-c")
    engines = collect(plugin_manager, "register_engines", "engine")
    assert sorted(engines) == ["a", "b", "c"]
    assert engines.owner == {"a": "engine-ab", "b": "engine-ab", "c": "engine-c"}


def test_one_plugin_name_from_two_distributions_names_both(fake_plugin: Any) -> None:
    fake_plugin("skulk-twin-one", plugin="engine-twin", module="skulk_twin_one")
    fake_plugin("skulk-twin-two", plugin="engine-twin", module="skulk_twin_two")
    with pytest.raises(PluginLoadError) as raised:
        installed_plugins()
    assert "skulk-twin-one" in str(raised.value) and "skulk-twin-two" in str(raised.value)


# ============================== guarded hooks ====================================================


def test_raising_implementation_is_logged_and_skipped(
    plugin_manager: pluggy.PluginManager, register_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    first, last = RecordingPlugin(["probe_node"]), RecordingPlugin(["probe_node"])
    register_plugin(first, "first")
    register_plugin(RecordingPlugin(["probe_node"], raising=["probe_node"]), "broken")
    register_plugin(last, "last")
    hooks = GuardedHooks(plugin_manager)
    with caplog.at_level(logging.ERROR, logger="skulk.hooks"):
        results = hooks.call("probe_node", facts={})
    assert results == []
    assert first.names() == ["probe_node"] and last.names() == ["probe_node"]  # both sides still ran
    assert hooks.failures == [("probe_node", "broken", repr(HookBoom("probe_node raised on purpose")))]
    assert "plugin 'broken' raised in hook probe_node" in caplog.text


def test_guarded_firstresult_skips_a_raising_decision(
    plugin_manager: pluggy.PluginManager, register_plugin: Any
) -> None:
    class Resolver:
        @hookimpl
        def resolve_model(self, ref: Any, catalog: Any) -> str:
            return "found"

    register_plugin(Resolver(), "resolver")
    register_plugin(RecordingPlugin(["resolve_model"], raising=["resolve_model"]), "broken")
    hooks = GuardedHooks(plugin_manager)
    assert hooks.call("resolve_model", firstresult=True, ref="x", catalog={}) == ["found"]
    assert [f[1] for f in hooks.failures] == ["broken"]


async def test_raising_async_implementation_is_skipped(
    plugin_manager: pluggy.PluginManager, register_plugin: Any
) -> None:
    seen: list[str] = []

    class Async:
        def __init__(self, name: str, fail: bool) -> None:
            self.name, self.fail = name, fail

        @hookimpl
        async def startup(self, node: Any) -> str:
            await asyncio.sleep(0)
            if self.fail:
                raise RuntimeError(f"{self.name} failed")
            seen.append(self.name)
            return self.name

    for name, fail in (("a", False), ("b", True), ("c", False)):
        register_plugin(Async(name, fail), name)
    hooks = GuardedHooks(plugin_manager)
    assert await hooks.acall("startup", reverse=True, node=None) == ["a", "c"]  # load order
    assert seen == ["a", "c"]
    assert await hooks.acall("startup", node=None) == ["c", "a"]  # reverse load order
    assert [f[:2] for f in hooks.failures] == [("startup", "b"), ("startup", "b")]


class Counter:
    """A well-behaved plugin: counts the hooks the node calls on it."""

    def __init__(self) -> None:
        self.events: list[int] = []
        self.started = self.stopped = 0
        self.probed = 0

    @hookimpl
    async def startup(self, node: Any) -> None:
        self.started += 1

    @hookimpl
    def probe_node(self, facts: dict[str, Any]) -> None:
        self.probed += 1

    @hookimpl
    async def on_event_applied(self, node: Any, event: Any, before: Any, after: Any) -> None:
        self.events.append(event.idx)

    @hookimpl
    def shutdown(self, node: Any) -> None:
        self.stopped += 1


async def test_node_keeps_running_when_hooks_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profile_path = tmp_path / "echo-only.toml"
    profile_path.write_text('[profile]\nname = "echo-only"\nplugins = ["engine-echo"]\n')
    profile = load_profile(profile_path)
    pm = build_plugin_manager(profile)
    before, after = Counter(), Counter()
    broken = RecordingPlugin(
        ["startup", "probe_node", "on_event_applied", "on_master_changed", "shutdown"],
        raising=["startup", "probe_node", "on_event_applied", "on_master_changed", "shutdown"],
    )
    register_plugin(pm, before, "before")
    register_plugin(pm, broken, "broken")
    register_plugin(pm, after, "after")

    node = Node(profile, NodeOptions(home=tmp_path / "home", no_api=True, node_name="t"), pm=pm)
    assert sorted(node.engines) == ["echo"]
    with caplog.at_level(logging.ERROR, logger="skulk.hooks"):
        await node.start()
        try:
            assert node.is_master  # a lone node with no election leads itself, despite the raise
            assert before.started == after.started == 1

            async def resources() -> Any:
                while (got := node.readings.get(NodeResources, node.node_id)) is None:
                    await asyncio.sleep(0.02)
                return got

            reading = (await asyncio.wait_for(resources(), 10)).reading
            assert reading.backends == ("echo-cpu",)  # telemetry survived a raising probe_node
            assert before.probed >= 1 and after.probed >= 1

            at = datetime.now(UTC)
            for idx in range(3):
                await node.ingest(
                    IndexedEvent(idx=idx, origin=node.node_id, at=at, event=NodeJoined(node_id=f"n{idx}"))
                )
            assert node.state.topology.nodes == ("n0", "n1", "n2")
            assert before.events == after.events == [0, 1, 2]
            assert [t.get_name() for t in node._tasks if t.done()] == []  # no background task died
        finally:
            await node.stop()
    assert before.stopped == after.stopped == 1
    failed_hooks = {hook for hook, plugin, _ in node.hooks.failures if plugin == "broken"}
    assert failed_hooks == {"startup", "probe_node", "on_event_applied", "on_master_changed", "shutdown"}
    assert {f[1] for f in node.hooks.failures} == {"broken"}
    assert "plugin 'broken' raised in hook on_event_applied" in caplog.text
    assert "the node keeps running" in caplog.text


# ============================== tracing ==========================================================


def test_trace_hooks_logs_every_call(
    plugin_manager: pluggy.PluginManager,
    register_plugin: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    register_plugin(RecordingPlugin(["probe_node", "configure"]), "traced")
    monkeypatch.setenv("SKULK_TRACE_HOOKS", "1")
    hooks = GuardedHooks(plugin_manager)
    with caplog.at_level(logging.INFO, logger="skulk.hooks"):
        hooks.call("probe_node", facts={})
        hooks.call("configure", node=None)
    lines = [r.getMessage() for r in caplog.records if r.name == "skulk.hooks"]
    assert len(lines) == 2
    assert lines[0].startswith("hook probe_node -> traced (") and lines[0].endswith(" ms)")
    assert lines[1].startswith("hook configure -> traced (")


@pytest.mark.parametrize("value", ["", "0"])
def test_no_trace_by_default(
    plugin_manager: pluggy.PluginManager,
    register_plugin: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    value: str,
) -> None:
    register_plugin(RecordingPlugin(["probe_node"]), "quiet")
    monkeypatch.setenv("SKULK_TRACE_HOOKS", value)
    with caplog.at_level(logging.DEBUG, logger="skulk.hooks"):
        GuardedHooks(plugin_manager).call("probe_node", facts={})
    assert [r for r in caplog.records if r.name == "skulk.hooks"] == []


def test_node_traces_hooks_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKULK_TRACE_HOOKS", "1")
    node = Node(profile_of("engine-echo"), NodeOptions(home=tmp_path))
    assert node.hooks.trace is True
    assert node.plugin_names == ["engine-echo"]


def test_trace_hooks_in_a_real_node_process(tmp_path: Path, node_factory: Any) -> None:
    profile = tmp_path / "echo-only.toml"
    profile.write_text('[profile]\nname = "echo-only"\nplugins = ["engine-echo"]\n')
    node = node_factory(str(profile), "--no-api", env={"SKULK_TRACE_HOOKS": "1"})
    node.wait_until(lambda: "hook probe_node -> engine-echo (" in node.log(), 30, "a traced hook call")
    node.stop()
    assert node.proc is not None and node.proc.returncode is not None


def test_kernel_defaults_are_registered_trylast() -> None:
    pm = new_plugin_manager()
    impls = pm.hook.resolve_model.get_hookimpls()
    assert [i.plugin_name for i in impls] == ["kernel-defaults"] and impls[0].trylast
