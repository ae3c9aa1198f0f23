"""Hosts that are apart ([hosts] 1, 2, 3, 5): three nodes, each in its own network namespace on one bridge.

What a LAN sees, not what loopback hides: every node has one address of its own and no loopback
reaches another; the join token is carried by hand (`cluster token` on the first machine, an
environment variable on the others), peers are found through bootstrap addresses, API keys are
required from every other address (no `open = true`), and the test process itself is one more host
on the LAN (the bridge's address), so it needs a key too. One cluster serves the whole module:

* A (first) holds SmolLM2 and is the store host; B and C join it with the token;
* a model placed from C (its control API, an operator key) runs on B and answers through A;
* the diagnostics fan-out and a store-host fetch cross the namespaces as member calls; an outsider
  namespace on the same bridge gets 401 on the node-to-node routes;
* a node of another network version knocks on C: A's /state (and dashboard) names C's mismatch;
* headless Chromium in a fourth namespace signs in to A's dashboard with keys (see e2e/hosts.mjs).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from skulk_testing.lan import LanNode
from skulk_testing.netns import Bridge, Netns
from skulk_testing.nodes import free_port

from tests.conftest import CHAT_MODEL
from tests.store.hub_server import HubRepo, LoopbackHub

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2"),
    pytest.mark.timeout(900),
]

PROFILE = """
[profile]
name = "hosts-lan"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-llamacpp", "store",
           "api-control", "api-openai", "observe", "hardware"]

[planes]
control = "zenoh"
telemetry = "zenoh"
data = "zenoh"

[plugins.master]
default_models = []

[plugins.engine-llamacpp]
n_threads = 1

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""
STORE_HOST = PROFILE + '\n[plugins.store]\nrole = "host"\n'
INTRUDER = """
[profile]
name = "hosts-lan-intruder"
plugins = ["transport-zenoh", "election-bully", "master", "api-control"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""
HUB_REPO, HUB_FILE = "test-org/lan-SmolLM2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LanHub(LoopbackHub):
    """The hub on the bridge's host address: the LAN's way out (nodes cannot reach host loopback)."""

    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> LanHub:
        from http.server import ThreadingHTTPServer

        import tests.store.hub_server as hub_server

        hub = self

        class Handler(hub_server._Handler):
            owner = hub

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        import threading

        threading.Thread(target=self._server.serve_forever, name="lan-hub", daemon=True).start()
        return self


@dataclass
class Lan:
    bridge: Bridge
    tmp: Path
    version: str
    token: str
    hub: LanHub
    nodes: dict[str, LanNode] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: list[LanNode] = field(default_factory=list)
    dashboard_dist: Path | None = None
    join_s: dict[str, float] = field(default_factory=dict)

    @property
    def a(self) -> LanNode:
        return self.nodes["a"]

    def node(
        self, name: str, profile: str, *args: str, env: dict[str, str] | None = None, ns: Netns | None = None
    ) -> LanNode:
        path = self.tmp / f"{name}.toml"
        path.write_text(profile)
        proc = LanNode(
            profile=str(path),
            home=self.tmp / name,
            api_port=free_port(),
            args=("--no-default-models", "--node-name", name, *args),
            env={
                "HOME": str(self.tmp / f"user-{name}"),  # each machine its own user: no shared ~/.skulk
                "SKULK_NETWORK_VERSION": self.version,
                "SKULK_JOIN_TOKEN": self.token,
                "SKULK_DASHBOARD_DIR": str(self.tmp / "dashboard-dist"),
                **(env or {}),
            },
        )
        proc.netns = ns or self.bridge.join()
        proc.disk = self.tmp / f"{name}-models"  # a disk of its own: no hardlinks between machines
        return proc

    def bootstrap(self) -> tuple[str, str]:
        return ("--bootstrap-peers", f"{self.a.ns.ns_ip}:{zenoh_port(self.a)}")


def zenoh_port(node: LanNode) -> str:
    status, diag = node.local("GET", "/v1/diagnostics/node")
    assert status == 200, diag
    return str(diag["transports"]["control"]["listen"][0].rsplit(":", 1)[1])


def cluster_token(home: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "cluster", "token", "-q"],
        env={**os.environ, "HOME": str(home), "SKULK_JOIN_TOKEN": ""},
        capture_output=True,
        timeout=60,
    )
    return out.stdout.decode().strip()


@pytest.fixture(scope="module")
def lan(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lan]:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.models import provision_smollm2

    gguf = provision_smollm2(models_dir)  # cached
    tmp = tmp_path_factory.mktemp("lan")
    bridge = Bridge().up()
    hub = LanHub(host=bridge.host_ip).start()
    hub.add(HubRepo.from_files(HUB_REPO, {HUB_FILE: Path(gguf)}))
    world = Lan(bridge=bridge, tmp=tmp, version=f"lan{secrets.token_hex(4)}", token="", hub=hub)
    folder = CHAT_MODEL.replace("/", "--")
    (tmp / "a-models").mkdir()
    subprocess.run(["cp", "-al", str(models_dir / folder), str(tmp / "a-models" / folder)], check=True)
    try:
        began = time.monotonic()
        a = world.node("a", STORE_HOST, env={"SKULK_JOIN_TOKEN": "", "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"})
        world.nodes["a"] = a.start().wait_api(90)
        world.ids["a"] = a.node_id()
        world.token = cluster_token(tmp / "user-a")  # carried by hand to the other machines
        assert world.token.startswith("skulk1-"), world.token
        for name in ("b", "c"):
            world.nodes[name] = world.node(name, PROFILE, *world.bootstrap()).start()
        for name in ("b", "c"):
            node = world.nodes[name].wait_api(90)
            world.ids[name] = node.node_id()
        a.wait_until(
            lambda: set(a.local("GET", "/state")[1]["topology"]["nodes"]) == set(world.ids.values()),
            90,
            "three machines in one topology",
        )
        world.join_s["lan"] = time.monotonic() - began
        for name, scope in (("operator", "operator"), ("chat", "inference"), ("doomed", "inference")):
            world.keys[name] = a.create_key(f"lan-{name}", scope)
        for node in world.nodes.values():  # the keys are State: in force on every node once applied
            node.key = world.keys["operator"]["key"]
            node.wait_until(lambda n=node: n.get("/node_id").status_code == 200, 30, "the operator key on it")
        yield world
    finally:
        for node in [*world.extra, *world.nodes.values()]:
            node.stop()
        hub.stop()
        bridge.down()


def _chat(node: LanNode, key: str) -> httpx.Response:
    return node.post(
        "/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": CHAT_MODEL, "max_tokens": 12, "messages": [{"role": "user", "content": "Say hi."}]},
        timeout=120,
    )


def test_three_machines_one_cluster_placed_from_the_third_answers_through_the_first(lan: Lan) -> None:
    a, b, c = (lan.nodes[n] for n in "abc")
    state = a.get("/state").json()
    for name, node in lan.nodes.items():  # each advertises its own LAN address, first
        addresses = state["nodeResources"][lan.ids[name]]["addresses"]
        assert addresses[0] == node.ns.ns_ip, (name, addresses)
        assert not any(x.startswith(lan.bridge.prefix) and x != node.ns.ns_ip for x in addresses), addresses
    for node in lan.nodes.values():  # keys required from another host: the test process is one
        assert httpx.get(node.url + "/state", timeout=10).status_code == 401
        assert httpx.post(node.url + "/v1/chat/completions", json={}, timeout=10).status_code == 401

    placed = c.post(
        "/place_instance", json={"model_id": CHAT_MODEL, "excluded_nodes": [lan.ids["a"], lan.ids["c"]]}, timeout=60
    )
    assert placed.status_code == 200, placed.text
    instance_id = placed.json()["instance_id"]
    a.wait_ready(CHAT_MODEL, timeout=300)
    inst = next(iter(a.get("/state").json()["instances"][instance_id].values()))
    assert set(inst["shardAssignments"]["nodeToRunner"]) == {lan.ids["b"]}, inst

    answer = _chat(a, lan.keys["chat"]["key"])  # an inference key, through the first machine
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"].strip(), answer.text
    copied = b.get("/store/transfers").json()["copied_from"]
    assert set(copied.get(CHAT_MODEL, {})) == {lan.ids["a"]}, copied  # B copied it from A, across the LAN
    assert a.delete(f"/instance/{instance_id}").status_code == 200
    a.wait_until(lambda: instance_id not in a.get("/state").json()["instances"], 60, "the instance gone")


def _curl(ns: Netns, url: str, *headers: str, method: str = "GET") -> int:
    argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "20", "-X", method]
    for header in headers:
        argv += ["-H", header]
    return int(subprocess.run(ns.command(*argv, url), capture_output=True, text=True, timeout=30).stdout or 0)


def test_fanout_and_store_host_fetch_cross_machines_as_members_outsiders_refused(lan: Lan) -> None:
    from skulk_api_control.member_auth import HEADER, PURPOSE, mint
    from skulk_transport_zenoh.secret import decode_token, derive

    a, b = lan.a, lan.nodes["b"]
    # the fan-out from A's own machine (no user key to forward): B and C let A in as a member
    status, view = a.local("GET", "/v1/diagnostics/cluster")
    assert status == 200, view
    answered = {n["nodeId"]: n["answered"] for n in view["nodes"]}
    assert answered == {node_id: True for node_id in lan.ids.values()}, view
    # and with an operator key from the LAN
    view = a.get("/v1/diagnostics/cluster", timeout=60).json()
    assert all(n["answered"] for n in view["nodes"]) and len(view["nodes"]) == 3, view

    # B (a worker) has the store host A fetch a model from the hub and stages A's copy
    added = a.post("/models/add", json={"repo_id": HUB_REPO, "download": False})
    assert added.status_code == 200, added.text
    assert b.local("POST", f"/store/models/{HUB_REPO}/download")[0] == 200

    def b_installed() -> bool:
        status, body = b.local("GET", f"/store/models/{HUB_REPO}/download")
        return status == 200 and body.get("status") in ("installed", "failed")

    b.wait_until(b_installed, 180, "B's staged copy of the hub model")
    assert b.local("GET", f"/store/models/{HUB_REPO}/download")[1]["status"] == "installed"
    assert lan.hub.repos[HUB_REPO].downloads == 1  # A fetched it once, asked by B
    assert HUB_REPO in a.get("/store/storage").json()["models"]
    assert "asked store host" in b.log() and "will not fetch" not in b.log()

    # an outsider on the same LAN, without the cluster's secret
    outsider = lan.bridge.join()
    forged_key = b"\0" * 32
    for name, node in lan.nodes.items():
        base = f"http://{node.ns.ns_ip}:{node.api_port}"
        download = f"/store/models/{HUB_REPO}/download"
        for path, method in (("/v1/diagnostics/node", "GET"), (download, "POST"), (download, "GET")):
            assert _curl(outsider, base + path, method=method) == 401, (name, path)
            forged = mint(forged_key, lan.ids["b"], method, path)
            assert _curl(outsider, base + path, f"{HEADER}: {forged}", method=method) == 401, (name, path)
    real = derive(decode_token(lan.token), PURPOSE)
    stranger = mint(real, "not-a-member", "GET", "/v1/diagnostics/node")  # even the secret needs membership
    assert _curl(outsider, f"{lan.a.url}/v1/diagnostics/node", f"{HEADER}: {stranger}") == 401


def ensure_intruder(lan: Lan) -> LanNode:
    """A node of another network version knocking on C (once per module)."""
    if lan.extra:
        return lan.extra[0]
    c = lan.nodes["c"]
    intruder = lan.node(
        "intruder",
        INTRUDER,
        "--bootstrap-peers",
        f"{c.ns.ns_ip}:{zenoh_port(c)}",
        env={"SKULK_NETWORK_VERSION": lan.version + "-other"},
    )
    lan.extra.append(intruder.start())
    return intruder


def _reasons_of_c(lan: Lan) -> list[dict[str, Any]]:
    health = lan.a.get("/state").json()["nodeHealth"]
    return [r for r in health.get(lan.ids["c"], {}).get("reasons", []) if "mismatched_peers" in r["message"]]


def test_a_version_mismatch_on_c_shows_in_a_state_naming_c(lan: Lan) -> None:
    intruder = ensure_intruder(lan).wait_api(90)
    lan.a.wait_until(lambda: bool(_reasons_of_c(lan)), 60, "C's version mismatch in A's /state")
    reason = _reasons_of_c(lan)[0]
    assert reason["node"] == lan.ids["c"] and reason["nodeName"] == "c", reason
    assert intruder.node_id() in reason["message"] and lan.version + "-other" in reason["message"], reason
    assert reason["remediation"].endswith("on c"), reason
    # C says so itself; A's entry for C is C's own report, carried by C's telemetry (NodeHealthNotes)
    _, c_state = lan.nodes["c"].local("GET", "/state")
    assert any("mismatched_peers" in r["message"] for r in c_state["nodeHealth"][lan.ids["c"]]["reasons"])


def test_dashboard_from_a_laptop_signs_in_with_keys(lan: Lan) -> None:
    from tests.dashboard.conftest import ARTIFACTS, DASHBOARD, _run, ensure_chromium, ensure_node_modules

    ensure_node_modules()
    chromium = ensure_chromium()
    dist = lan.tmp / "dashboard-dist"  # the folder every node serves (SKULK_DASHBOARD_DIR)
    npx = shutil.which("npx") or "npx"
    _run([npx, "vite", "build", "--outDir", str(dist), "--emptyOutDir", "--logLevel", "warn"], DASHBOARD, timeout=300)
    ensure_intruder(lan)
    lan.a.wait_until(lambda: bool(_reasons_of_c(lan)), 60, "C's version mismatch in A's /state")

    a = lan.a  # the link printed by `skulk-kernel keys create`, run on A's machine
    argv = ("keys", "--url", a.local_url, "create", "--name", "link", "--scope", "operator")
    created = subprocess.run(
        a.ns.command(sys.executable, "-m", "skulk_kernel.cli", *argv),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(lan.tmp / "user-a")},
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[0]
    link = next(line.split(": ", 1)[1] for line in created.stderr.splitlines() if "dashboard signed in" in line)
    assert link.startswith(f"{a.url}/ui/#key=") and key in link, link

    laptop = lan.bridge.join()
    doomed = lan.keys["doomed"]
    cmd = laptop.command(
        shutil.which("node") or "node", "e2e/hosts.mjs", "--url", a.url, "--out", str(ARTIFACTS),
        "--model", CHAT_MODEL, "--nodes", "3", "--health-node", lan.ids["c"],
        "--operator-key", lan.keys["operator"]["key"], "--inference-key", lan.keys["chat"]["key"],
        "--doomed-key", doomed["key"], "--doomed-id", doomed["id"], "--link", link,
    )  # fmt: skip
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        cmd, cwd=DASHBOARD, capture_output=True, text=True, timeout=600, env={**os.environ, "CHROMIUM": str(chromium)}
    )
    print(done.stdout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    result = json.loads(lines[-1][7:])

    assert result["askedForKey"] and "refused" in result["wrongKeyError"], result
    assert result["scope"] == "operator" and result["nodeCards"] == 3, result
    assert result["healthCard"]["level"] == "warn", result["healthCard"]
    assert any("mismatched_peers" in r for r in result["healthReasons"]), result["healthReasons"]
    assert result["answer"].strip(), "the operator's chat streamed nothing"
    assert result["inferenceScope"] == "inference" and result["inferenceNodeCards"] == 3, result
    assert result["inferenceLaunchButtons"] == 0 and result["inferencePreviewRows"] == 0, result
    assert result["inferenceDeleteButtons"] == 0, result
    assert result["inferenceAnswer"].strip(), "the inference key's chat streamed nothing"
    assert "revoked" in result["revokedError"] and result["revokedToSignInS"] < 15, result
    assert result["keyLeftInStorage"] is None
    assert result["linkScope"] == "operator" and "#key=" not in result["linkUrlAfter"], result
    assert not [e for e in result["consoleErrors"] if "status of 401" not in e], result["consoleErrors"]
    print(f"\nlaunch -> ready {result['launchToReadyS']:.1f} s; revoked -> sign-in {result['revokedToSignInS']:.1f} s")
    _, keys = a.local("GET", "/v1/keys")
    assert doomed["id"] not in {k["id"] for k in keys["keys"]}
    log = "".join(node.log() for node in lan.nodes.values())
    for secret in (lan.keys["operator"]["key"], lan.keys["chat"]["key"], doomed["key"], key):
        assert secret not in log  # no key in any node's log
