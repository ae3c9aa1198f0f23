"""The hello engine passes the engine conformance suite from skulk-testing.

Runs from a source checkout too: the package folder is put on sys.path when it is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from skulk_kernel.contracts import RunnerSpec
from skulk_kernel.models import ModelCard
from skulk_testing.conformance import EngineConformance, make_runner_spec

try:
    from skulk_hello.engine import HelloEngine
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from skulk_hello.engine import HelloEngine


class TestHelloEngine(EngineConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls) -> HelloEngine:
        return HelloEngine()

    @pytest.fixture(scope="class")
    @classmethod
    def runner_spec(cls) -> RunnerSpec:
        card = ModelCard(model_id="hello/tiny", n_layers=1, hidden_size=1, compatible_backends=("hello-cpu",))
        return make_runner_spec(card)
