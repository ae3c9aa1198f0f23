"""A provisioner's progress reads in bytes: its fraction scaled to the card's size ([dashboard]: a
44 MiB model's download once showed as "1000 B", the fraction's per-mille taken for bytes)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from skulk_kernel.api import ModelCard
from skulk_store.store import LocalModelStore

MODEL = "test-org/provisioned-progress"
SIZE = 44 * 2**20


def test_a_provisioners_fraction_reads_in_the_cards_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def provision(models_dir: Path, progress=None, cache_dir=None) -> Path:
        for fraction in (0.0, 0.5, 1.0):
            progress("fetching", fraction)
        target = models_dir / "model.gguf"
        target.write_bytes(b"weights")
        return target

    module = ModuleType("fake_progress_provisioner")
    module.provision = provision  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_progress_provisioner", module)
    store = LocalModelStore(tmp_path / "models")
    card = ModelCard(
        model_id=MODEL,
        n_layers=1,
        hidden_size=8,
        storage_size=SIZE,
        sections={"source": {"kind": "callable", "call": "fake_progress_provisioner:provision"}},
    )
    store.card_lookup = lambda model_id: card if model_id == MODEL else None
    seen: list[tuple[int, int]] = []
    assert store.ensure_local(MODEL, lambda done, total, phase: seen.append((done, total))) is not None
    assert seen[-3:] == [(0, SIZE), (SIZE // 2, SIZE), (SIZE, SIZE)], seen
