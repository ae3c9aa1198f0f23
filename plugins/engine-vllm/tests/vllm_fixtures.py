"""Shared slow fixtures: the vLLM CPU venv (installed once, through the CLI's own code path) and
the SmolLM2 safetensors folder (converted once, inside that venv)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def vllm_python() -> Path:
    """The cached vLLM CPU venv, created on first use by the same call `engines install vllm` makes."""
    if not sys.platform.startswith("linux"):
        pytest.skip("vLLM's CPU build is tested on Linux")
    from skulk_engine_vllm.venv import VenvError, ensure_vllm_venv

    try:
        return ensure_vllm_venv("cpu", lambda m: print(f"[vllm venv] {m}", flush=True))
    except VenvError as exc:
        pytest.skip(f"the vLLM CPU venv cannot be installed here: {exc}")


def smollm2_folder(models_dir: Path) -> Path:
    from skulk_engine_vllm.models import SMOLLM2_ID, ProvisionError, VllmModelStore

    vllm_python()
    store = VllmModelStore(lambda: models_dir, lambda: "cpu")
    try:
        found = store.ensure_local(SMOLLM2_ID)
    except ProvisionError as exc:
        pytest.skip(f"SmolLM2 safetensors not provisionable here: {exc}")
    assert found is not None
    return found
