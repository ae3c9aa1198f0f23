"""The echo engine against the skulk-testing conformance suites: the worked example for plugins."""

from __future__ import annotations

import pytest
from skulk_engine_echo.engine import ECHO_EMBED_MODEL, ECHO_MODEL, EchoEngine, EchoModelStore, echo_cards
from skulk_kernel.api import RunnerSpec
from skulk_testing.conformance import (
    EngineConformance,
    ModelStoreConformance,
    PluginConformance,
    make_runner_spec,
)


class TestEchoPlugin(PluginConformance):
    plugin_name = "engine-echo"
    hook_owners = ("api-control", "hardware")  # plugin_fits is hardware's hook (hardware needs api-control)


class TestEchoEngine(EngineConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls) -> EchoEngine:
        return EchoEngine()

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls) -> RunnerSpec:
        return make_runner_spec(echo_cards()[ECHO_MODEL])

    @pytest.fixture(scope="class")
    @classmethod
    def embedding_runner_spec(cls) -> RunnerSpec:
        return make_runner_spec(echo_cards()[ECHO_EMBED_MODEL])


class TestEchoModelStore(ModelStoreConformance):
    @pytest.fixture
    def store(self) -> EchoModelStore:
        return EchoModelStore()
