"""The generic strategy builder, the recording plugin and the fake distributions."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated, Any, Literal, NewType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field
from skulk_kernel.hookspecs import hookimpl
from skulk_kernel.instances import RingInstance, ShardMetadata
from skulk_kernel.tasks import TextGenerationParams
from skulk_kernel.wire import Tagged, WireModel, tagged_union
from skulk_testing.recording import RecordingPlugin, hookspec_names
from skulk_testing.strategies import StrategyBuilder, json_values, strategy_for, union_members

Ident = NewType("Ident", str)
FAST = settings(max_examples=60, deadline=None)


class Inner(Tagged):
    level: int = Field(ge=3, le=5)


class Other(Tagged):
    label: Literal["x", "y"]


Either = tagged_union(Inner, Other)


class Everything(WireModel):
    ident: Ident
    count: int = Field(gt=-2, lt=2)
    ratio: float = Field(ge=0, le=1)
    maybe: float | None = Field(default=None, ge=10)
    when: dt.datetime
    names: tuple[str, ...] = Field(min_length=2, max_length=4)
    pair: tuple[int, bool]
    table: dict[Ident, Either]
    nested: tuple[Annotated[int, Field(ge=100)], ...] = ()
    anything: Any = None
    flag: bool = False


@FAST
@given(strategy_for(Everything))
def test_generated_models_validate_and_respect_constraints(value: Everything) -> None:
    assert -2 < value.count < 2
    assert 0 <= value.ratio <= 1
    assert value.maybe is None or value.maybe >= 10
    assert value.when.tzinfo is not None and value.when.utcoffset() == dt.timedelta(0)
    assert 2 <= len(value.names) <= 4
    assert all(n >= 100 for n in value.nested)
    for item in value.table.values():
        assert isinstance(item, (Inner, Other))
        if isinstance(item, Inner):
            assert 3 <= item.level <= 5
    assert Everything.model_validate(json.loads(json.dumps(value.wire()))) == value


def test_every_union_member_is_reachable() -> None:
    seen: set[str] = set()

    @settings(max_examples=100, deadline=None, database=None)
    @given(strategy_for(ShardMetadata))
    def draw(shard: Any) -> None:
        seen.add(type(shard).__name__)

    draw()
    assert seen == {t.__name__ for t in union_members(ShardMetadata)}
    assert len(seen) == 2


@FAST
@given(StrategyBuilder(ids=["p", "q"]).strategy_for(Everything))
def test_id_pool(value: Everything) -> None:
    assert value.ident in ("p", "q") and set(value.table) <= {"p", "q"}


@FAST
@given(json_values())
def test_json_values_round_trip(value: Any) -> None:
    assert json.loads(json.dumps(value)) == value


def test_min_length_fields() -> None:
    @settings(max_examples=30, deadline=None)
    @given(strategy_for(TextGenerationParams))
    def check(params: TextGenerationParams) -> None:
        assert len(params.messages) >= 1

    check()


def test_overrides_and_registered_types() -> None:
    builder = StrategyBuilder()
    builder.register(dt.datetime, st.just(dt.datetime(2030, 1, 1, tzinfo=dt.UTC)))
    strategy = builder.model(Everything, count=st.just(1))

    @settings(max_examples=20, deadline=None)
    @given(strategy)
    def check(value: Everything) -> None:
        assert value.count == 1 and value.when.year == 2030

    check()


def test_unsupported_types_say_how_to_fix() -> None:
    class Odd:
        pass

    class HasOdd(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        odd: Odd

    with pytest.raises(TypeError, match=r"register one with StrategyBuilder\.register"):
        strategy_for(HasOdd).validate()


def test_union_members_of_tagged_union() -> None:
    assert union_members(Either) == (Inner, Other)
    assert union_members(int | None) == (int, type(None))
    assert union_members(RingInstance) == (RingInstance,)


# ============================== recording plugin =================================================


def test_recording_plugin_implements_every_hook(plugin_manager: Any, register_plugin: Any) -> None:
    recorder = RecordingPlugin()
    register_plugin(recorder, "recorder")
    plugin_manager.check_pending()
    names = {c.name for c in plugin_manager.get_hookcallers(recorder)}
    assert names == set(hookspec_names())
    assert recorder.names() == ["add_hookspecs"]  # historic: replayed on registration
    plugin_manager.hook.probe_node(facts={"a": 1})
    assert recorder.calls_of("probe_node")[0].kwargs == {"facts": {"a": 1}}


def test_recording_plugin_does_not_change_results(plugin_manager: Any, register_plugin: Any) -> None:
    register_plugin(RecordingPlugin(), "recorder")
    catalog = {"org/model": object()}
    assert plugin_manager.hook.resolve_model(ref="MODEL", catalog=catalog) is catalog["org/model"]


def test_hookspec_names_are_in_source_order() -> None:
    names = hookspec_names()
    assert names[:3] == ["add_hookspecs", "register_config", "configure"]
    assert names[-1] == "shutdown"  # wrap_inference is api-control's (skulk_api_control.hookspecs)


# ============================== fake distributions and in-process nodes ==========================


def test_fake_plugin_is_seen_by_metadata(fake_plugin: Any) -> None:
    from skulk_kernel.plugins import installed_plugins

    fake_plugin("skulk-fake-metadata", "1.2.3", module="skulk_fake_metadata_mod", module_source="X = 1\n")
    info = installed_plugins()["fake-metadata"]
    assert (info.distribution, info.version, info.module) == ("skulk-fake-metadata", "1.2.3", "skulk_fake_metadata_mod")
    assert info.kernel_range in (">=0.1,<0.2", "<0.2,>=0.1")


def test_fake_plugin_is_gone_after_the_test() -> None:
    from skulk_kernel.plugins import installed_plugins

    assert "fake-metadata" not in installed_plugins()


async def test_in_process_node(tmp_path: Path) -> None:
    from skulk_testing.nodes import in_process_node

    started: list[str] = []

    class Plugin:
        @hookimpl
        def startup(self, node: Any) -> None:
            started.append(node.node_id)

    from skulk_kernel.plugins import build_plugin_manager, register_plugin
    from skulk_kernel.profiles import Profile

    profile = Profile(name="p", plugins=("engine-echo",))
    pm = build_plugin_manager(profile)
    register_plugin(pm, Plugin(), "probe")
    async with in_process_node(profile, home=tmp_path / "n", pm=pm) as node:
        assert node.is_master and "echo" in node.engines
        assert node.options.no_api
        assert started == [node.node_id]
    async with in_process_node(["engine-echo"], home=tmp_path / "m") as other:
        assert other.plugin_names == ["engine-echo"]
