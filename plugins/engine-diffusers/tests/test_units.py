"""Unit tests of the parts that need no torch: cards and sizes, request checks, media pieces, url files."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import pytest
from skulk_engine_diffusers.cards import CardError, DiffusersModelStore, card_for_folder, parse_size
from skulk_engine_diffusers.config import DiffusersConfig
from skulk_engine_diffusers.files import ImageFiles
from skulk_engine_diffusers.image_requests import BadRequest, check, sniff_image
from skulk_engine_diffusers.pieces import PIECE_BYTES, Assembler, PieceError, split
from skulk_testing.conformance import PluginConformance


class TestDiffusersPlugin(PluginConformance):
    plugin_name = "engine-diffusers"
    hook_owners = ("api-control", "hardware")  # it implements register_api_routes and plugin_fits


def write_folder(root: Path, sample_size: int = 32, vae_blocks: int = 2, unet_blocks: int = 2) -> Path:
    """The JSON skeleton of a diffusers folder (what cards read; no weights needed)."""
    (root / "unet").mkdir(parents=True)
    (root / "vae").mkdir()
    (root / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "StableDiffusionPipeline",
                "unet": ["diffusers", "UNet2DConditionModel"],
                "vae": ["diffusers", "AutoencoderKL"],
            }
        )
    )
    (root / "unet" / "config.json").write_text(
        json.dumps({"sample_size": sample_size, "block_out_channels": [32] * unet_blocks, "cross_attention_dim": 32})
    )
    (root / "vae" / "config.json").write_text(json.dumps({"block_out_channels": [32] * vae_blocks}))
    return root


def test_card_from_a_folder_states_its_size_rules(tmp_path: Path) -> None:
    card = card_for_folder(write_folder(tmp_path / "sd-like", sample_size=64, vae_blocks=4, unet_blocks=4))
    assert card.model_id == "sd-like" and card.tasks == ("ImageGeneration",)
    image = card.sections["image"]
    assert image["native_size"] == "512x512" and image["size_multiple"] == 64 and image["supports_edits"]
    assert card.sections["source"] == {"kind": "local", "path": str((tmp_path / "sd-like").resolve())}
    assert parse_size(card, None, 2**20) == (512, 512)
    assert parse_size(card, "auto", 2**20) == (512, 512)
    assert parse_size(card, "768x512", 2**20) == (768, 512)
    for bad in ("500x500", "2048x512", "512", "512x512x3", "0x0"):
        with pytest.raises(CardError, match="multiple of 64"):
            parse_size(card, bad, 2**20)
    with pytest.raises(CardError):
        parse_size(card, "1024x1024", 512 * 512)  # over the node's pixel bound


def test_a_folder_without_unet_is_refused_and_the_store_skips_it(tmp_path: Path) -> None:
    write_folder(tmp_path / "good")
    (tmp_path / "flux").mkdir()
    (tmp_path / "flux" / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    with pytest.raises(CardError, match="only UNet pipelines"):
        card_for_folder(tmp_path / "flux")
    store = DiffusersModelStore([str(tmp_path)])
    assert list(store.catalog()) == ["good"]
    assert store.local_path("good") == (tmp_path / "good").resolve()
    assert store.local_path("flux") is None


def png(width: int, height: int) -> bytes:
    raw = b"".join(b"\x00" + b"\x80" * (width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_sniff_image() -> None:
    assert sniff_image(png(4, 4)) == "png"
    assert sniff_image(b"\xff\xd8\xff\xe0" + b"\x00" * 20) == "jpeg"
    assert sniff_image(b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 8) == "webp"
    for bad in (b"", b"hello", b"\x89PNG\r\n\x1a\n", b"GIF89a" + b"\x00" * 20):
        assert sniff_image(bad) is None


class _Node:
    """check() needs no node state; resolve happens before it."""


@pytest.fixture
def card(tmp_path: Path):
    return card_for_folder(write_folder(tmp_path / "tiny"))


def test_check_accepts_a_good_body_and_keeps_extensions(card) -> None:
    body = {
        "prompt": "a fox",
        "n": 2,
        "size": "64x32",
        "response_format": "url",
        "output_format": "webp",
        "seed": 5,
        "steps": 3,
        "guidance_scale": 2,
        "negative_prompt": "blur",
    }
    request = check(body, _Node(), DiffusersConfig(), card, "tiny")  # type: ignore[arg-type]
    assert request.params.n == 2 and request.params.seed == 5 and request.size == "64x32"
    assert request.params.options == {
        "output_format": "webp",
        "steps": 3,
        "guidance_scale": 2.0,
        "negative_prompt": "blur",
    }
    assert request.response_format == "url"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": "  "}, "prompt"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 5}, "n"),
        ({"prompt": "x", "n": True}, "n"),
        ({"prompt": "x", "size": "999x999"}, "size"),
        ({"prompt": "x", "size": 64}, "size"),
        ({"prompt": "x", "response_format": "png"}, "response_format"),
        ({"prompt": "x", "output_format": "gif"}, "output_format"),
        ({"prompt": "x", "background": "transparent"}, "background"),
        ({"prompt": "x", "stream": True}, "stream"),
        ({"prompt": "x", "strength": 2}, "strength"),
        ({"prompt": "x", "seed": "abc"}, "seed"),
    ],
)
def test_check_refuses_with_the_param_to_fix(card, body: dict, param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        check(body, _Node(), DiffusersConfig(max_n=4), card, "tiny")  # type: ignore[arg-type]
    assert caught.value.param == param and caught.value.status == 400


def test_pieces_round_trip_and_refuse_damage() -> None:
    data = bytes(range(256)) * (PIECE_BYTES // 128 + 3)  # three pieces
    pieces = list(split("c1", data, "image/png", 0, 5))
    assert [p.seq for p in pieces] == [5, 6, 7] and [bool(p.sha256) for p in pieces] == [False, False, True]
    assembler = Assembler(max_bytes=len(data))
    for piece in pieces:
        assembler.add(piece)
    assert assembler.complete(1) == [(data, "image/png")]

    tampered = pieces[1].model_copy(update={"data": base64.b64encode(b"x" * 10).decode()})
    with pytest.raises(PieceError, match="SHA-256"):
        broken = Assembler(max_bytes=len(data))
        for piece in (pieces[0], tampered, pieces[2]):
            broken.add(piece)
    with pytest.raises(PieceError, match="over the limit"):
        small = Assembler(max_bytes=len(data) - 1)
        for piece in pieces:
            small.add(piece)
    partial = Assembler(max_bytes=len(data))
    partial.add(pieces[0])
    with pytest.raises(PieceError, match="without their last piece"):
        partial.complete(1)
    with pytest.raises(PieceError, match="did not arrive"):
        Assembler(max_bytes=10).complete(2)


def test_url_files_expire_and_stay_within_their_bytes() -> None:
    now = [0.0]
    files = ImageFiles(ttl_s=10, max_bytes=100, clock=lambda: now[0])
    first = files.put(b"a" * 60, "image/png", "png")
    assert first.startswith("img_") and first.endswith(".png")
    stored = files.get(first)
    assert stored is not None and stored.data == b"a" * 60
    second = files.put(b"b" * 60, "image/png", "png")  # does not fit beside the first: the oldest goes
    assert files.get(first) is None and files.get(second) is not None
    now[0] = 11.0
    assert files.get(second) is None and len(files) == 0
    assert files.get("img_unknown.png") is None


def test_config_defaults() -> None:
    config = DiffusersConfig()
    assert config.threads == 1 and config.max_n == 4 and config.model_dirs == []
