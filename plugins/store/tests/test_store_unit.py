"""Fast tests of the store's parts: the contract suites, the GGUF header reader, file choice,
the loopback hub driven by huggingface_hub (resolve, card from a range request, resumed download)."""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from skulk_store.gguf_header import NotGGUF, Truncated, read_metadata
from skulk_store.hub import HubError, pick_files
from skulk_store.store import LocalModelStore, PathOutsideModelDirs
from skulk_testing.conformance import ModelStoreConformance, PluginConformance

ROOT = Path(__file__).resolve().parents[3]


class TestStorePlugin(PluginConformance):
    plugin_name = "store"
    hook_owners = ("api-control",)  # it implements register_api_routes


class TestLocalStore(ModelStoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalModelStore:
        return LocalModelStore(tmp_path / "models")


def _gguf(kvs: list[tuple[str, int, bytes]]) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, value in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    return out


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def test_gguf_header_reads_scalars_skips_arrays_and_says_when_cut() -> None:
    vocab = struct.pack("<IQ", 8, 2) + _s("a") + _s("bc")
    data = _gguf(
        [
            ("general.architecture", 8, _s("llama")),
            ("llama.block_count", 4, struct.pack("<I", 30)),
            ("tokenizer.ggml.tokens", 9, vocab),
            ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        ]
    )
    meta = read_metadata(data)
    assert meta == {"general.architecture": "llama", "llama.block_count": 30, "llama.rope.freq_base": 10000.0}
    with pytest.raises(Truncated):
        read_metadata(data[:-2])
    with pytest.raises(NotGGUF):
        read_metadata(b"PK\x03\x04" + data[4:])


def test_pick_files_prefers_named_then_quant_then_smallest() -> None:
    def sib(name: str, size: int = 1) -> SimpleNamespace:
        return SimpleNamespace(rfilename=name, size=size, lfs=None)

    repo = [sib("m.Q8_0.gguf", 8), sib("m.Q4_K_M.gguf", 4), sib("README.md")]
    assert pick_files(repo, None)[1] == "m.Q4_K_M.gguf"
    assert pick_files(repo, "m.Q8_0.gguf")[1] == "m.Q8_0.gguf"
    assert pick_files([sib("a.IQ2.gguf", 5), sib("b.IQ3.gguf", 3)], None)[1] == "b.IQ3.gguf"
    folder, main = pick_files([sib("config.json"), sib("model.safetensors"), sib("x.py")], None)
    assert main == "" and {s.rfilename for s in folder} == {"config.json", "model.safetensors"}
    with pytest.raises(HubError):
        pick_files([sib("README.md")], None)
    with pytest.raises(HubError):
        pick_files(repo, "absent.gguf")
    # a vision repository: the projector comes with the model, and is never taken for the model
    vision = [sib("mmproj-m-f16.gguf", 1), sib("mmproj-m-q8.gguf", 1), sib("m.Q8_0.gguf", 8), sib("m.Q4_K_M.gguf", 4)]
    files, main = pick_files(vision, None)
    assert main == "m.Q4_K_M.gguf" and [s.rfilename for s in files] == ["m.Q4_K_M.gguf", "mmproj-m-f16.gguf"]
    files, main = pick_files(vision, "m.Q8_0.gguf")
    assert [s.rfilename for s in files] == ["m.Q8_0.gguf", "mmproj-m-f16.gguf"]
    assert pick_files([sib("mmproj-only.gguf"), sib("m.Q4_0.gguf")], None)[1] == "m.Q4_0.gguf"


def test_add_local_refuses_paths_outside_the_model_dirs(tmp_path: Path) -> None:
    store = LocalModelStore(tmp_path / "models", model_dirs=(tmp_path / "extra",))
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(PathOutsideModelDirs):
        store.add_local(tmp_path / "elsewhere" / "m.gguf")
    (tmp_path / "extra").mkdir()
    with pytest.raises(ValueError, match="neither"):  # inside a root: refused only for its content
        store.add_local(tmp_path / "extra")


def test_hub_download_resumes_a_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.store.hub_server import HubRepo, LoopbackHub

    blob = os.urandom(3_000_000)  # a folder repository: config.json and one weight file
    (tmp_path / "w.bin").write_bytes(blob)
    (tmp_path / "config.json").write_text("{}")
    with LoopbackHub() as hub:
        hub.add(HubRepo.from_files("acme/blob", {"w.bin": tmp_path / "w.bin", "config.json": tmp_path / "config.json"}))
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        import huggingface_hub.constants as hf_constants

        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        from skulk_store import hub as h

        model = h.resolve("acme/blob", file="w.bin")
        assert model.files[0].sha256 == hashlib.sha256(blob).hexdigest()
        assert len(model.commit) == 40 and model.commit == hub.repos["acme/blob"].commit
        folder = tmp_path / "dl"
        part = h.partial_path(folder, "w.bin", model.files[0].sha256)
        part.parent.mkdir(parents=True)
        part.write_bytes(blob[:1_000_000])  # what a killed run left
        path = h.download_file(model, "w.bin", folder)
        assert path.read_bytes() == blob
        assert hub.sent_for("w.bin") == 2_000_000  # only the missing bytes crossed
