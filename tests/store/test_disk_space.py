"""Acceptance 4 of [capacity] (disk): a download larger than the free space of a small filesystem is
refused before any byte is written, and a node low on disk says so in its health.

The small filesystem is an 8 MiB tmpfs mounted in a private mount namespace made for the node
process alone (`unshare -m` as root, `unshare -rm` — a user namespace too — otherwise), so nothing
is left mounted on the machine whatever happens to the test. The test reads the node's view of it
through `/proc/<pid>/root`. The hub is the loopback one (`hub_server.py`) with a 16 MiB repository
and a 2 MiB one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from skulk_testing.nodes import NodeProcess, free_port

from .conftest import SOLO, wait
from .hub_server import HubRepo, LoopbackHub

MiB = 1 << 20
SIZE = "8m"
UNSHARE = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
MOUNT = f'mount -t tmpfs -o size={SIZE} tmpfs "$0" && exec "$@"'

PROFILE = (
    SOLO
    + """
[plugins.store]
disk_headroom_bytes = 1_048_576   # 1 MiB
low_disk_bytes = 7_340_032        # 7 MiB: an 8 MiB disk holding the 2 MiB model is low
"""
)


def _can_mount(folder: Path) -> str | None:
    """None when this process may mount a tmpfs in a new mount namespace, else why not."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([*UNSHARE, "sh", "-c", MOUNT, str(folder), "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run unshare: {exc}"
    if done.returncode != 0:
        return f"cannot mount a tmpfs in a new mount namespace ({' '.join(UNSHARE)}): {done.stderr.decode()[-300:]}"
    return None


@dataclass
class SmallDiskNode(NodeProcess):
    """A node whose models directory is a fresh 8 MiB tmpfs, seen by this process alone."""

    models: Path = Path()

    def start(self) -> SmallDiskNode:
        self.home.mkdir(parents=True, exist_ok=True)
        self.models.mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "node.log"
        env = {**os.environ, "SKULK_HOME": str(self.home), **self.env}
        cmd = [*UNSHARE, "sh", "-c", MOUNT, str(self.models), sys.executable, "-m", "skulk_kernel.cli", "run"]
        cmd += ["--profile", self.profile, "--api-port", str(self.api_port), "--api-host", "127.0.0.1"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def seen(self) -> Path:
        """The models directory as the node sees it (its mount namespace)."""
        return Path(f"/proc/{self.pid()}/root") / str(self.models).lstrip("/")

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.seen())) for p in self.seen().rglob("*") if p.is_file())


@pytest.fixture
def small_disk(tmp_path: Path) -> SmallDiskNode:
    if (why := _can_mount(tmp_path / "probe")) is not None:
        pytest.skip(why)
    return SmallDiskNode(profile="", home=tmp_path / "home", api_port=free_port(), models=tmp_path / "small")


def _repo(tmp_path: Path, repo_id: str, weights: str, size: int) -> HubRepo:
    folder = tmp_path / "hub" / repo_id.replace("/", "--")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"num_hidden_layers": 2, "hidden_size": 64, "model_type": "llama"}')
    (folder / weights).write_bytes(os.urandom(size))
    return HubRepo.from_files(repo_id, {"config.json": folder / "config.json", weights: folder / weights})


def _health(node: NodeProcess) -> dict:
    return node.state()["nodeHealth"][node.get("/node_id").json()]


def _failed_downloads(node: NodeProcess) -> dict:
    state = node.state()
    mine = state["downloads"].get(node.get("/node_id").json(), {})
    return {m: s for m, s in mine.items() if "Failed" in str(s)}


def _store_notes(node: NodeProcess) -> list[dict]:
    return [r for r in _health(node)["reasons"] if r["message"].startswith("store: ")]


def test_a_download_larger_than_the_disk_is_refused_before_any_byte(tmp_path: Path, small_disk: SmallDiskNode) -> None:
    profile = tmp_path / "small-disk.toml"
    profile.write_text(PROFILE)
    with LoopbackHub() as hub:
        hub.add(_repo(tmp_path, "acme/too-big", "big.safetensors", 16 * MiB))
        hub.add(_repo(tmp_path, "acme/fits", "small.safetensors", 2 * MiB))
        small_disk.profile = str(profile)
        small_disk.env = {
            "HF_ENDPOINT": hub.url,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "SKULK_MODELS_DIR": str(small_disk.models),
        }
        node = small_disk.start()
        try:
            node.wait_api()
            disk = node.get("/store/storage").json()["disk"]
            assert disk["total_bytes"] == 8 * MiB == disk["free_bytes"], disk  # the node sees the tmpfs

            # 1. by repository id: refused with the reason, the card not added, nothing fetched or written
            refused = node.post("/models/add", json={"repo_id": "acme/too-big"})
            assert refused.status_code == 507, refused.text
            error = refused.json()["error"]
            assert error["code"] == "insufficient_disk"
            assert error["message"].startswith(
                f"downloading acme/too-big needs 16.0 MiB (+ 1.0 MiB headroom) on {small_disk.models}, "
                "but only 8.0 MiB is free: free space or set [plugins.store] models_dir to a larger disk"
            ), error
            assert "acme/too-big" not in {m["id"] for m in node.get("/models").json()["data"]}

            # 2. the card alone, then POST /store/models/{id}/download: refused the same way
            added = node.post("/models/add", json={"repo_id": "acme/too-big", "download": False})
            assert added.status_code == 200 and added.json()["download"] == "not requested", added.text
            again = node.post("/store/models/acme/too-big/download")
            assert again.status_code == 507 and again.json()["error"]["code"] == "insufficient_disk", again.text
            assert "needs 16.0 MiB" in again.json()["error"]["message"]
            status = node.get("/store/models/acme/too-big/download").json()
            assert status["status"] == "failed" and "needs 16.0 MiB" in status["error"]

            # zero bytes written in the target: no file (no intent, no partial), the tmpfs untouched
            assert hub.sent_for("big.safetensors") == 0
            assert node.files() == []
            disk = node.get("/store/storage").json()["disk"]
            assert disk["free_bytes"] == 8 * MiB and disk["low_disk"] is None, disk

            # the node is healthy otherwise: its only health reason is api-control's fixed telemetry check
            # (NodeDisk under 2 GiB, which an 8 MiB disk always is); no store note, no failed download
            reasons = _health(node)["reasons"]
            assert [r for r in reasons if not r["message"].startswith("models disk has")] == [], reasons

            # 3. a model that fits is downloaded onto the same disk; the disk is then low (< 7 MiB free)
            fits = node.post("/models/add", json={"repo_id": "acme/fits"})
            assert fits.status_code == 200 and fits.json()["download"] == "started", fits.text
            wait(
                lambda: node.get("/store/models/acme/fits/download").json()["status"] == "installed",
                60,
                "acme/fits installed",
            )
            assert "acme--fits/small.safetensors" in node.files()
            low = wait(lambda: _store_notes(node), 20, "the low-disk note")
            assert "below [plugins.store] low_disk_bytes = 7.0 MiB" in str(low), low

            # 4. space freed: the note clears
            deleted = httpx.delete(node.url + "/store/models/acme/fits", timeout=10)
            assert deleted.status_code == 200, deleted.text
            wait(lambda: not _store_notes(node), 20, "the low-disk note cleared")
            assert node.get("/store/storage").json()["disk"]["low_disk"] is None

            # 5. a placement whose staging needs the download: the instance fails with the same reason
            big = hub.repos["acme/too-big"]
            card = {
                "model_id": "acme/too-big-echo",
                "n_layers": 2,
                "hidden_size": 64,
                "tasks": ["TextGeneration"],
                "storage_size": sum(f.size for f in big.files.values()),
                "compatible_backends": ["echo-cpu"],
                "source": {
                    "kind": "hub",
                    "repo_id": "acme/too-big",
                    "revision": big.commit,
                    "main_file": "",
                    "files": {n: {"size": f.size, "sha256": f.sha256} for n, f in big.files.items()},
                },
            }
            assert node.post("/models/add-card", json={"card": card}).status_code == 200
            placed = node.post("/place_instance", json={"model_id": "acme/too-big-echo"})
            assert placed.status_code == 200, placed.text
            failed = wait(lambda: _failed_downloads(node).get("acme/too-big-echo"), 30, "the staging failure")
            assert "downloading acme/too-big-echo needs 16.0 MiB (+ 1.0 MiB headroom)" in str(failed), failed
            wait(lambda: not node.state()["instances"], 30, "the failed instance removed")
            assert hub.sent_for("big.safetensors") == 0 and node.files() == []
        finally:
            node.stop()
