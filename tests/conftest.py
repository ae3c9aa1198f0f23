"""Cross-plugin tests: real node processes, real engines, real models.

Models are provisioned once per machine into $SKULK_TEST_MODELS_DIR (default
<tmp>/skulk-test-models), shared with the engine plugin's own tests, so only the first run pays
the ~180 MB download from the package index.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest
from skulk_testing.nodes import NodeProcess, start_node

MODELS_DIR = Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")
CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
QWEN_MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"


@pytest.fixture(scope="session")
def models_dir() -> Path:
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    return MODELS_DIR


@pytest.fixture(scope="session")
def llama_node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One cpu-llamacpp node (the README's default profile) serving the two default models, started once
    per run: the repository's conftest.py sends every module that uses it to one xdist worker."""
    pytest.importorskip("xllamacpp")
    node = start_node(
        "cpu-llamacpp",
        home=tmp_path_factory.mktemp("llama-node"),
        # a network version of its own, so it never joins another test's (or an operator's) cluster on this host
        env={"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"llama-{uuid.uuid4().hex[:10]}"},
    )
    try:
        node.wait_api(timeout=60)
        node.wait_ready(CHAT_MODEL, timeout=300)
        node.wait_ready(EMBED_MODEL, timeout=300)
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def qwen_node(models_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One cpu-llamacpp node with only the optional Qwen2.5-Coder-0.5B-Instruct card placed (provisioned once
    into the shared models dir; skipped where it cannot be), for the suites that only send it requests (tool
    round trips, fill-in-the-middle): the repository's conftest.py sends them to one xdist worker."""
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.models import ProvisionError, provision_qwen05

    from tests.serving.placing import place_until_listed

    try:
        provision_qwen05(models_dir)  # cached after the first run; the node then only checks the hash
    except ProvisionError as exc:
        pytest.skip(f"Qwen2.5-Coder-0.5B not provisionable here: {exc}")
    env = {"SKULK_MODELS_DIR": str(models_dir), "SKULK_NETWORK_VERSION": f"qwen-{uuid.uuid4().hex[:8]}"}
    node = start_node("cpu-llamacpp", "--no-default-models", home=tmp_path_factory.mktemp("qwen-node"), env=env)
    try:
        node.wait_api(timeout=60)
        place_until_listed(node, QWEN_MODEL)
        node.wait_ready(QWEN_MODEL, timeout=300)
        yield node
    finally:
        node.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if {"llama_node", "qwen_node"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


__all__ = ["NodeProcess"]
