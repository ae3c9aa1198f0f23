"""Fast tests of staging on real files: eviction order, hard links and their fallback, purge, and a
hub download stopped mid-file (the cancel of `/store/models/{id}/download`) that resumes."""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from skulk_kernel.api import ModelCard
from skulk_store.staging import StagedCopy, choose_evictions, link_or_copy
from skulk_store.store import LocalModelStore, folder_name

ROOT = Path(__file__).resolve().parents[3]
MB = 1_000_000


def _copy(model_id: str, size: int, used: float) -> StagedCopy:
    return StagedCopy(model_id=model_id, source="host", how="hardlink", bytes=size, last_used=used)


def test_eviction_takes_the_least_recently_used_copies_not_in_use() -> None:
    staged = [_copy("a", 40, 1.0), _copy("b", 40, 3.0), _copy("c", 40, 2.0)]
    assert choose_evictions(staged, set(), budget=100, incoming=40) == ["a", "c"]  # oldest first
    assert choose_evictions(staged, {"a"}, budget=100, incoming=40) == ["c", "b"]  # "a" is in use
    assert choose_evictions(staged, set(), budget=200, incoming=40) == []  # fits
    assert choose_evictions(staged, {"a", "b", "c"}, budget=10, incoming=40) == []  # all in use: over budget


def _host_with(tmp_path: Path, model_id: str, size: int) -> tuple[LocalModelStore, Path]:
    host = LocalModelStore(tmp_path / "host", role="host")
    folder = host.folder(model_id)
    (folder / "sub").mkdir(parents=True)
    (folder / "w.gguf").write_bytes(os.urandom(size))
    (folder / "sub" / "tokenizer.json").write_text("{}")
    card = ModelCard(model_id=model_id, n_layers=1, hidden_size=8, storage_size=size)
    host.install(card, folder, "w.gguf")
    return host, folder


def _stage(worker: LocalModelStore, host: LocalModelStore, model_id: str) -> dict[str, str]:
    card, _ = host.installed()[model_id]
    manifest = host.manifest(model_id)
    tmp = worker.models_dir / f".staging-{folder_name(model_id)}"
    how = link_or_copy(host.folder(model_id), tmp, manifest)
    kind = "hardlink" if set(how.values()) == {"hardlink"} else "copy"
    staged = StagedCopy(model_id=model_id, source="host", how=kind, bytes=card.storage_size)
    worker.adopt_staged(card, tmp, "w.gguf", manifest, staged)
    return how


def test_staging_links_evicts_by_recency_and_purges(tmp_path: Path) -> None:
    worker = LocalModelStore(tmp_path / "worker", staging_budget=5 * MB)
    hosts = {m: _host_with(tmp_path / m, m, 3 * MB) for m in ("org/a", "org/b", "org/c")}
    worker.models_dir.mkdir()

    assert set(_stage(worker, hosts["org/a"][0], "org/a").values()) == {"hardlink"}
    ours, theirs = worker.folder("org/a") / "w.gguf", hosts["org/a"][1] / "w.gguf"
    assert ours.stat().st_ino == theirs.stat().st_ino and theirs.stat().st_nlink == 2
    assert worker.verify("org/a") == []  # the sidecar's manifest matches the linked files
    assert worker.ensure_local("org/a") == ours  # a use: recency

    time.sleep(0.05)
    assert worker.evict_for(3 * MB, protect={"org/b"}) == ["org/a"]  # 3 + 3 > 5: the only copy goes
    assert theirs.stat().st_nlink == 1 and theirs.exists()  # the canonical copy stays
    _stage(worker, hosts["org/b"][0], "org/b")

    # b in use: c's arrival cannot evict it; the node goes over budget instead
    worker.in_use = lambda: {"org/b"}
    assert worker.evict_for(3 * MB, protect={"org/c"}) == []
    _stage(worker, hosts["org/c"][0], "org/c")
    assert set(worker.staged_copies()) == {"org/b", "org/c"}

    result = worker.purge_staging()
    assert result["purged"] == ["org/c"] and result["kept_in_use"] == ["org/b"]
    assert result["bytes_freed"] == 3 * MB + 2  # the weights and tokenizer.json ("{}")
    assert result["disk_bytes_freed"] == 0  # hard links: the host still holds the bytes
    assert set(worker.installed()) == {"org/b"}


def test_a_failed_link_falls_back_to_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host, folder = _host_with(tmp_path, "org/x", MB)
    worker = LocalModelStore(tmp_path / "worker")
    worker.models_dir.mkdir()

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    assert set(_stage(worker, host, "org/x").values()) == {"copy"}
    copied = worker.folder("org/x") / "w.gguf"
    assert copied.read_bytes() == (folder / "w.gguf").read_bytes()
    assert copied.stat().st_ino != (folder / "w.gguf").stat().st_ino
    assert worker.staged_copies()["org/x"].how == "copy"


def test_a_hub_download_stops_mid_file_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT))
    from skulk_store import hub as h

    from tests.store.hub_server import HubRepo, LoopbackHub

    blob = os.urandom(24 * MB)  # over two of huggingface_hub's 10 MiB blocks
    (tmp_path / "w.bin").write_bytes(blob)
    (tmp_path / "config.json").write_text("{}")
    with LoopbackHub() as server:
        files = {"w.bin": tmp_path / "w.bin", "config.json": tmp_path / "config.json"}
        server.add(HubRepo.from_files("acme/blob", files))
        server.throttle_bps = 24e6  # about a second for the file
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        import huggingface_hub.constants as hf_constants

        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        model = h.resolve("acme/blob", file="w.bin")
        stop = threading.Event()
        threading.Timer(0.2, stop.set).start()
        with pytest.raises(h.Interrupted):
            h.download_file(model, "w.bin", tmp_path / "dl", stop.is_set)
        part = h.partial_path(tmp_path / "dl", "w.bin", model.files[0].sha256)
        kept = part.stat().st_size
        assert 0 < kept < len(blob)  # stopped mid-file, the bytes so far kept
        # the first response may still be draining into a dead socket on a loaded machine: measure the
        # resume by what it alone asks for, once the first attempt's count has settled
        first = -1
        while (sent := server.sent_for("w.bin")) != first:
            first = sent
            time.sleep(0.3)
        server.throttle_bps = 0
        assert h.download_file(model, "w.bin", tmp_path / "dl").read_bytes() == blob
        assert server.sent_for("w.bin") - first <= len(blob) - kept + MB  # the rest only, not the file again
