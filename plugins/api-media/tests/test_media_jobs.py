"""Unit tests of the job framework's parts: the [video] section, file assembly, the job store."""

from __future__ import annotations

import base64
import hashlib
import time
from pathlib import Path

import pytest
from skulk_api_media.assembly import AssemblyError, MediaAssembler
from skulk_api_media.jobs import Job, JobStore, StoreFull
from skulk_api_media.video_section import VideoRequestError, VideoSection, resolve, snap_frames
from skulk_kernel.api import CommandId, MediaChunk
from skulk_testing.conformance import PluginConformance

SECTION = VideoSection(
    modes=("t2v",),
    sizes=("160x96", "320x180"),
    fps=12,
    frame_grid_multiple=4,
    frame_grid_offset=1,
    min_seconds=0.5,
    max_seconds=8,
    default_seconds=2,
)


class TestApiMediaPlugin(PluginConformance):
    plugin_name = "api-media"
    hook_owners = ("api-control", "hardware")  # it implements register_api_routes and plugin_fits


def test_frames_snap_up_to_the_grid() -> None:
    assert [snap_frames(n, 4, 1) for n in (1, 2, 5, 24, 25, 26)] == [1, 5, 5, 25, 25, 29]
    assert snap_frames(24, 8, 0) == 24 and snap_frames(0, 1, 0) == 1


def test_resolve_fills_defaults_and_refuses_what_the_card_does_not_allow() -> None:
    resolved = resolve(SECTION, size=None, seconds=None, steps=None, has_image=False)
    assert (resolved.width, resolved.height, resolved.frames, resolved.fps) == (160, 96, 25, 12)
    with pytest.raises(VideoRequestError) as bad:
        resolve(SECTION, size="1920x1080", seconds=2, steps=None, has_image=False)
    assert bad.value.param == "size" and "160x96, 320x180" in bad.value.message
    with pytest.raises(VideoRequestError) as bad:
        resolve(SECTION, size=None, seconds=9, steps=None, has_image=False)
    assert bad.value.param == "seconds" and bad.value.code == "unsupported_duration"
    with pytest.raises(VideoRequestError) as bad:
        resolve(SECTION, size=None, seconds=2, steps=None, has_image=True)
    assert bad.value.code == "unsupported_mode"
    with pytest.raises(ValueError):
        VideoSection(sizes=("15x15",))


def pieces(data: bytes, size: int, digest: str | None = None) -> list[MediaChunk]:
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    return [
        MediaChunk(
            command_id=CommandId("c"),
            seq=i,
            data=base64.b64encode(p).decode(),
            mime="video/mp4",
            sha256=(digest or hashlib.sha256(data).hexdigest()) if i == len(parts) - 1 else "",
            finish_reason="stop" if i == len(parts) - 1 else None,
        )
        for i, p in enumerate(parts)
    ]


def test_assembly_lands_a_verified_file_and_refuses_a_wrong_digest_or_too_many_bytes(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    good = MediaAssembler(tmp_path / "a.mp4", max_bytes=len(data))
    assert [good.add(p) for p in pieces(data, 1000)][-1] is True
    assert (tmp_path / "a.mp4").read_bytes() == data and not (tmp_path / "a.mp4.part").exists()

    wrong = MediaAssembler(tmp_path / "b.mp4", max_bytes=len(data))
    with pytest.raises(AssemblyError, match="SHA-256"):
        for p in pieces(data, 1000, digest="0" * 64):
            wrong.add(p)
    wrong.discard()
    assert not list(tmp_path.glob("b.mp4*"))

    small = MediaAssembler(tmp_path / "c.mp4", max_bytes=1500)
    with pytest.raises(AssemblyError, match="limit of 1500"):
        for p in pieces(data, 1000):
            small.add(p)
    small.discard()
    assert not list(tmp_path.glob("c.mp4*"))


def job(store: JobStore, job_id: str, created: float) -> Job:
    made = Job(id=job_id, model="m", prompt="p", size="160x96", seconds=2, frames=25, fps=12, created_at=created,
               expires_at=created + store.ttl_s)  # fmt: skip
    store.add(made)
    return made


def test_store_progress_only_rises_finish_cleans_up_and_jobs_expire(tmp_path: Path) -> None:
    store = JobStore(tmp_path, ttl_s=100, max_jobs=3, max_active=2)
    now = time.time()
    a = job(store, "video_a", now - 200)
    store.progress(a, 5, 10, "sampling")
    store.progress(a, 2, 10, "sampling")
    assert a.status == "in_progress" and a.progress == 49
    a.assembler = MediaAssembler(store.path_for(a.id), 10)
    store.path_for(a.id).with_suffix(".mp4.part").write_bytes(b"partial")
    store.finish(a, "failed", "engine_crashed", "the server died")
    assert a.wire()["error"] == {"code": "engine_crashed", "message": "the server died"}
    assert not list(tmp_path.iterdir())
    b = job(store, "video_b", now)
    job(store, "video_c", now)
    with pytest.raises(StoreFull):
        job(store, "video_d", now)  # two active already
    store.finish(b, "cancelled")
    job(store, "video_e", now)  # the store is full: the oldest finished job (a) makes room
    assert "video_a" not in store.jobs and "video_b" in store.jobs
    store.path_for("video_b").write_bytes(b"done")
    assert store.sweep(now + 101) == ["video_b", "video_c", "video_e"]
    assert not store.jobs and not list(tmp_path.iterdir())
