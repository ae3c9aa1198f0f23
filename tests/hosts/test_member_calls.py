"""Node-to-node calls as members ([hosts] 3), across a network namespace with API keys required.

A runs on the host, B in a namespace (another "machine"); neither is open. From loopback (no
key), A's cluster diagnostics fan out to B, which requires a key from A's address: the call is let
in by A's member token (`X-Skulk-Member`, HMAC from the cluster secret), not by a user's key. From
the namespace, a caller without the secret gets 401 on the same routes, with or without a forged
token; a real token replayed on another route is refused too.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from skulk_testing.netns import Netns
from skulk_testing.nodes import NodeProcess, free_port

from tests.security.test_netns_security import NsNode, _token, _zenoh_port

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2"),
    pytest.mark.timeout(300),
]

PROFILE = """
[profile]
name = "hosts-members"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store",
           "api-control", "api-openai", "observe"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = Netns().up()
    try:
        yield ns
    finally:
        ns.down()


def _curl(ns: Netns, url: str, *headers: str, method: str = "GET") -> int:
    argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "20", "-X", method]
    for header in headers:
        argv += ["-H", header]
    return int(subprocess.run(ns.command(*argv, url), capture_output=True, text=True, timeout=30).stdout or 0)


def test_fanout_across_hosts_as_a_member_and_outsiders_refused(tmp_path: Path, netns: Netns) -> None:
    from skulk_api_control.member_auth import HEADER, PURPOSE, mint
    from skulk_transport_zenoh.secret import decode_token, derive

    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE)
    version = f"hosts{secrets.token_hex(4)}"
    common = ("--api-host", "0.0.0.0", "--no-default-models")
    a = NodeProcess(
        profile=str(profile),
        home=tmp_path / "a",
        api_port=free_port(),
        args=(*common, "--node-name", "a"),
        env={"HOME": str(tmp_path / "owner"), "SKULK_NETWORK_VERSION": version, "SKULK_JOIN_TOKEN": ""},
    ).start()
    b: NsNode | None = None
    try:
        a.wait_api()
        token = _token(tmp_path, "owner")
        b = NsNode(
            profile=str(profile),
            home=tmp_path / "b",
            api_port=free_port(),
            args=(*common, "--node-name", "b", "--bootstrap-peers", f"{netns.host_ip}:{_zenoh_port(a)}"),
            env={"HOME": str(tmp_path / "other"), "SKULK_NETWORK_VERSION": version, "SKULK_JOIN_TOKEN": token},
        )
        b.netns = netns
        b.start()
        a.wait_until(lambda: len(a.state()["topology"]["nodes"]) == 2, 60, "B in A's topology")
        b_id = next(n for n in a.state()["topology"]["nodes"] if n != a.get("/node_id").json())

        def b_answered() -> bool:
            view = a.get("/v1/diagnostics/cluster", timeout=30).json()
            entry = next(n for n in view["nodes"] if n["nodeId"] == b_id)
            return bool(entry["answered"])

        a.wait_until(b_answered, 60, "B's answer in A's cluster diagnostics (as a member, no user key)")
        b_url = f"http://{netns.ns_ip}:{b.api_port}"
        assert _curl(netns, b_url + "/v1/diagnostics/node") == 401  # B does require a key from other hosts

        # outsiders, from the namespace, on A's node-to-node routes (A requires keys from there)
        a_url = f"http://{netns.host_ip}:{a.api_port}"
        download = a_url + "/store/models/HuggingFaceTB/SmolLM2-135M-Instruct/download"
        for url, method in ((a_url + "/v1/diagnostics/node", "GET"), (download, "POST"), (download, "GET")):
            assert _curl(netns, url, method=method) == 401
            forged = mint(b"\0" * 32, b_id, method, url.split(str(a.api_port), 1)[1])
            assert _curl(netns, url, f"{HEADER}: {forged}", method=method) == 401
        key = derive(decode_token(token), PURPOSE)
        real = mint(key, b_id, "GET", "/v1/diagnostics/node")
        assert _curl(netns, a_url + "/v1/diagnostics/node", f"{HEADER}: {real}") == 200  # a member's token
        assert _curl(netns, a_url + "/state", f"{HEADER}: {real}") == 401  # replayed on another route
        stale = mint(key, b_id, "GET", "/v1/diagnostics/node", now=time.time() - 120)
        assert _curl(netns, a_url + "/v1/diagnostics/node", f"{HEADER}: {stale}") == 401
        stranger = mint(key, "not-a-member", "GET", "/v1/diagnostics/node")
        assert _curl(netns, a_url + "/v1/diagnostics/node", f"{HEADER}: {stranger}") == 401
    finally:
        if b is not None:
            b.stop()
        a.stop()


STORE_HOST = """
[profile]
name = "hosts-store-host"
plugins = ["transport-zenoh", "election-bully", "master", "store", "api-control"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.store]
role = "host"

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""


def test_a_worker_in_another_namespace_has_the_store_host_fetch_as_a_member(
    tmp_path: Path, netns: Netns, models_dir: Path
) -> None:
    """The worker (B, in the namespace) asks the store host (A, keys required from B's address) to
    fetch a model from the hub and follows its progress: both calls are let in by B's member token."""
    from skulk_engine_llamacpp.models import provision_smollm2

    from tests.store.hub_server import HubRepo, LoopbackHub

    repo, gguf = "test-org/hosts-SmolLM2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    host_profile, worker_profile = tmp_path / "host.toml", tmp_path / "worker.toml"
    host_profile.write_text(STORE_HOST)
    worker_profile.write_text(PROFILE)
    version = f"hosts{secrets.token_hex(4)}"
    with LoopbackHub() as hub:
        hub.add(HubRepo.from_files(repo, {gguf: Path(provision_smollm2(models_dir))}))
        a = NodeProcess(
            profile=str(host_profile),
            home=tmp_path / "a",
            api_port=free_port(),
            args=("--api-host", "0.0.0.0", "--node-name", "host"),
            env={
                "HOME": str(tmp_path / "owner"),
                "SKULK_NETWORK_VERSION": version,
                "SKULK_JOIN_TOKEN": "",
                "SKULK_MODELS_DIR": str(tmp_path / "a-models"),
                "HF_ENDPOINT": hub.url,
                "HF_HUB_OFFLINE": "0",
            },
        ).start()
        b: NsNode | None = None
        try:
            a.wait_api()
            a_id = a.get("/node_id").json()
            b = NsNode(
                profile=str(worker_profile),
                home=tmp_path / "b",
                api_port=free_port(),
                args=(
                    "--api-host",
                    "0.0.0.0",
                    "--no-default-models",
                    "--node-name",
                    "worker",
                    "--bootstrap-peers",
                    f"{netns.host_ip}:{_zenoh_port(a)}",
                ),
                env={
                    "HOME": str(tmp_path / "other"),
                    "SKULK_NETWORK_VERSION": version,
                    "SKULK_JOIN_TOKEN": _token(tmp_path, "owner"),
                    "SKULK_MODELS_DIR": str(tmp_path / "b-models"),
                },
            )
            b.netns = netns
            b.start()
            a.wait_until(lambda: len(a.state()["topology"]["nodes"]) == 2, 60, "B in A's topology")
            added = a.post("/models/add", json={"repo_id": repo, "download": False})
            assert added.status_code == 200, added.text
            on_b = f"http://127.0.0.1:{b.api_port}"  # B's own loopback, from its namespace

            def b_knows_the_host() -> bool:
                status, _, body = netns.http("GET", on_b + "/store/registry")
                return status == 200 and a_id in body["hosts"] and bool(body["hosts"][a_id]["reachable"])

            a.wait_until(b_knows_the_host, 60, "the store host in B's registry")
            assert netns.http("GET", f"http://{netns.host_ip}:{a.api_port}/store/registry")[0] == 401  # keys required

            def b_installed() -> bool:
                status, _, body = netns.http("GET", f"{on_b}/store/models/{repo}/download")
                return status == 200 and body.get("status") in ("installed", "failed")

            assert netns.http("POST", f"{on_b}/store/models/{repo}/download")[0] == 200
            a.wait_until(b_installed, 120, "B's staged copy")
            assert netns.http("GET", f"{on_b}/store/models/{repo}/download")[2]["status"] == "installed"
            assert hub.repos[repo].downloads == 1  # the host fetched it, asked by B
            assert repo in a.get("/store/storage").json()["models"]
            assert "asked store host" in b.log() and "will not fetch" not in b.log()
        finally:
            if b is not None:
                b.stop()
            a.stop()
