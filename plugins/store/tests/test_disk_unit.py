"""Free-space checks with a monkeypatched `shutil.disk_usage`: a download, a provisioning, a staging
copy refused before any byte is written, partial files counted, and the low-disk health note."""

from __future__ import annotations

import errno
import os
import shutil
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from skulk_kernel.api import ModelCard
from skulk_store import disk
from skulk_store.disk import GiB, InsufficientDisk, MiB
from skulk_store.staging import link_or_copy
from skulk_store.store import LocalModelStore

Usage = namedtuple("Usage", "total used free")


def _free(monkeypatch: pytest.MonkeyPatch, free: int) -> list[str]:
    """Every disk_usage says `free` bytes are free; returns the paths asked about."""
    asked: list[str] = []

    def usage(path: Any) -> Usage:
        asked.append(str(path))
        return Usage(100 * GiB, 100 * GiB - free, free)

    monkeypatch.setattr(disk.shutil, "disk_usage", usage)
    return asked


def _hub_card(model_id: str, sizes: dict[str, int]) -> ModelCard:
    source = {
        "kind": "hub",
        "repo_id": "acme/big",
        "revision": "a" * 40,
        "main_file": "",
        "files": {name: {"size": size, "sha256": f"{i:064x}"} for i, (name, size) in enumerate(sizes.items())},
    }
    return ModelCard(
        model_id=model_id, n_layers=1, hidden_size=8, storage_size=sum(sizes.values()), sections={"source": source}
    )


def test_the_message_names_the_need_the_headroom_the_folder_and_the_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _free(monkeypatch, int(2.1 * GiB))
    with pytest.raises(InsufficientDisk) as refused:
        disk.ensure_room(tmp_path / "not" / "yet", int(4.6 * GiB), GiB, "downloading acme/big")
    assert str(refused.value) == (
        f"downloading acme/big needs 4.6 GiB (+ 1.0 GiB headroom) on {tmp_path / 'not' / 'yet'}, but only "
        "2.1 GiB is free: free space or set [plugins.store] models_dir to a larger disk"
    )
    assert asked == [str(tmp_path)]  # the nearest existing folder
    disk.ensure_room(tmp_path, int(1.1 * GiB), GiB, "fits")  # 1.1 + 1 <= 2.1
    disk.ensure_room(tmp_path, 0, 10 * GiB, "nothing to write")  # nothing to fetch: never refused
    assert disk.human(3 * MiB) == "3.0 MiB" and disk.human(512) == "0.5 KiB"


def test_a_hub_download_is_refused_before_any_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _free(monkeypatch, 3 * GiB)
    store = LocalModelStore(tmp_path / "models", disk_headroom=GiB)
    card = _hub_card("acme/big", {"model.safetensors": 3 * GiB, "config.json": 600})
    store.card_lookup = lambda mid: card if mid == card.model_id else None
    with pytest.raises(InsufficientDisk, match=r"downloading acme/big needs 3\.0 GiB \(\+ 1\.0 GiB headroom\)"):
        store.ensure_local("acme/big")  # raised from Downloads.fetch, before the hub is asked anything
    assert not (tmp_path / "models").exists()  # no folder, no intent file, no partial file
    with pytest.raises(InsufficientDisk):
        store.check_room(card)  # what the routes ask first
    assert store.bytes_to_fetch(card) == 3 * GiB + 600


def test_partial_files_count_as_already_fetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skulk_store import hub

    store = LocalModelStore(tmp_path / "models", disk_headroom=0)
    card = _hub_card("acme/big", {"w.bin": 10 * MiB, "config.json": 100})
    folder = store.downloads.folder("acme--big")
    part = hub.partial_path(folder, "w.bin", card.sections["source"]["files"]["w.bin"]["sha256"])
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * (6 * MiB))
    (folder / "config.json").write_text("x" * 100)
    assert store.bytes_to_fetch(card) == 4 * MiB  # a resume writes only the rest
    _free(monkeypatch, 5 * MiB)
    store.check_room(card)  # 4 MiB fit in 5
    _free(monkeypatch, 3 * MiB)
    with pytest.raises(InsufficientDisk, match=r"needs 4\.0 MiB"):
        store.check_room(card)


def test_provisioning_is_refused_before_the_provisioner_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _free(monkeypatch, 50 * MiB)
    store = LocalModelStore(tmp_path / "models", disk_headroom=MiB)
    card = store.catalog()["HuggingFaceTB/SmolLM2-135M-Instruct"]  # bundled, ~98 MB, a provisioner
    with pytest.raises(InsufficientDisk, match="provisioning HuggingFaceTB/SmolLM2-135M-Instruct needs 93"):
        store.ensure_local(card.model_id)
    assert not (tmp_path / "models").exists()


def test_a_staging_copy_is_refused_before_a_byte_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, target = tmp_path / "host", tmp_path / "worker"
    source.mkdir()
    (source / "a.bin").write_bytes(b"a" * 1000)
    (source / "b.bin").write_bytes(b"b" * 3000)
    asked: list[int] = []

    def room(need: int) -> None:
        asked.append(need)
        raise InsufficientDisk(f"copying needs {need}")

    assert link_or_copy(source, target, ["a.bin", "b.bin"], room) == {"a.bin": "hardlink", "b.bin": "hardlink"}
    assert asked == []  # hard links take no room: never asked

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    shutil.rmtree(target)
    with pytest.raises(InsufficientDisk):
        link_or_copy(source, target, ["a.bin", "b.bin"], room)
    assert asked == [4000]  # every file still to copy, asked once, before the first copy
    assert not any(p.is_file() for p in target.rglob("*"))


def test_low_disk_is_a_health_note_until_it_recovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skulk_store.service import StoreService

    node = SimpleNamespace(options=SimpleNamespace(home=tmp_path / "home"), health_notes={"other": {"x": "y"}})
    store = LocalModelStore(tmp_path / "models", low_disk_bytes=2 * GiB)
    service = StoreService(node, store)  # type: ignore[arg-type]
    _free(monkeypatch, 5 * GiB)
    assert service.probe_disk() is None and "store" not in node.health_notes
    _free(monkeypatch, int(1.5 * GiB))
    note = service.probe_disk()
    assert note is not None and note.startswith("only 1.5 GiB free on ")
    assert "low_disk_bytes = 2.0 GiB" in note
    assert node.health_notes["store"] == {"low_disk": note}
    _free(monkeypatch, 3 * GiB)
    assert service.probe_disk() is None
    assert node.health_notes == {"other": {"x": "y"}}  # cleared; other plugins' notes untouched
    store.low_disk_bytes = None
    _free(monkeypatch, 0)
    assert service.probe_disk() is None  # the check is off
