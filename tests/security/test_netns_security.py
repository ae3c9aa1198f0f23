"""Acceptance of [secure] from a network namespace the test creates (veth pair; needs root).

1. a node in the namespace without the secret cannot join and the refusal shows in /state health;
   with the join token it joins;
3. from the namespace: no key -> 401, inference key -> 200/403, operator key -> both, revoked -> 401
   within 2 s on every node;
4. a quota of N tokens per minute -> 429 with Retry-After in all four formats.
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
from pathlib import Path
from typing import Any

import pytest
from skulk_testing.netns import Netns
from skulk_testing.nodes import NodeProcess, free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")

PROFILE = """
[profile]
name = "secure-test"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store",
           "api-control", "api-openai", "api-anthropic", "api-ollama", "providers"]

[planes]
control = "zenoh"

[plugins.master]
default_models = ["skulk/echo"]

[plugins.transport-zenoh]
multicast_scouting = false
hello_interval_s = 0.5
"""


WS_PROBE = """
import sys
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
headers = {"Authorization": "Bearer " + sys.argv[2]} if len(sys.argv) > 2 else {}
try:
    connect(sys.argv[1], additional_headers=headers, open_timeout=10).close()
    print(101)
except InvalidStatus as exc:
    print(exc.response.status_code)
"""


def ws_handshake(ns: Netns, url: str, key: str | None) -> int:
    """The status of a WebSocket handshake made from inside the namespace (101: opened)."""
    argv = ns.command(sys.executable, "-c", WS_PROBE, url, *([key] if key else []))
    out = subprocess.run(argv, capture_output=True, timeout=30)
    return int(out.stdout.decode().strip() or 0)


class NsNode(NodeProcess):
    """A node process inside the namespace (its API on the namespace's address)."""

    netns: Netns | None = None

    @property
    def url(self) -> str:
        return f"http://{self.netns.ns_ip}:{self.api_port}" if self.netns else super().url

    def start(self) -> NsNode:
        assert self.netns is not None
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "node.log"
        env = {**os.environ, "SKULK_HOME": str(self.home), "HF_HUB_OFFLINE": "1", **self.env}
        cmd = [
            "ip",
            "netns",
            "exec",
            self.netns.name,
            sys.executable,
            "-m",
            "skulk_kernel.cli",
            "run",
            "--profile",
            self.profile,
            "--api-port",
            str(self.api_port),
            "--api-host",
            "0.0.0.0",
            *self.args,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = Netns().up()
    try:
        yield ns
    finally:
        ns.down()


@pytest.fixture
def world(tmp_path: Path, netns: Netns) -> Iterator[dict[str, Any]]:
    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE)
    open_profile = tmp_path / "open-profile.toml"  # nodes in the namespace: the test reads them from the host
    open_profile.write_text(PROFILE + "\n[plugins.api-control]\nopen = true\n")
    version = f"sec{secrets.token_hex(4)}"
    started: list[NodeProcess] = []

    def node(name: str, user: str, *args: str, in_ns: bool = False, env: dict[str, str] | None = None) -> NodeProcess:
        cls = NsNode if in_ns else NodeProcess
        proc = cls(
            profile=str(open_profile if in_ns else profile),
            home=tmp_path / name,
            api_port=free_port(),
            args=("--api-host", "0.0.0.0", "--node-name", name, *args),
            # the user's own secret (~/.skulk), not the test process's $SKULK_JOIN_TOKEN
            env={"HOME": str(tmp_path / user), "SKULK_NETWORK_VERSION": version, "SKULK_JOIN_TOKEN": "", **(env or {})},
        )
        if isinstance(proc, NsNode):
            proc.netns = netns
        started.append(proc.start())
        return proc

    try:
        yield {"node": node, "ns": netns, "tmp": tmp_path}
    finally:
        for proc in started:
            proc.stop()


def _zenoh_port(node: NodeProcess) -> str:
    return node.get("/v1/diagnostics/node").json()["transports"]["control"]["listen"][0].rsplit(":", 1)[1]


def _token(tmp: Path, user: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "cluster", "token", "-q"],
        env={**os.environ, "HOME": str(tmp / user), "SKULK_JOIN_TOKEN": ""},
        capture_output=True,
        timeout=60,
    )
    return out.stdout.decode().strip()


def test_without_the_secret_a_node_cannot_join_and_with_the_token_it_does(world: dict[str, Any]) -> None:
    member = world["node"]("member", "owner").wait_api()
    member.wait_ready("skulk/echo", 60)
    member_id = member.get("/node_id").json()
    member_instances = set(member.state()["instances"])
    bootstrap = ("--bootstrap-peers", f"{world['ns'].host_ip}:{_zenoh_port(member)}")
    outsider = world["node"]("outsider", "stranger", *bootstrap, in_ns=True).wait_api(60)
    outsider_id = outsider.get("/node_id").json()

    def refused() -> bool:
        reasons = member.state()["nodeHealth"][member_id]["reasons"]
        return any("refused" in r["message"] and outsider_id in r["message"] for r in reasons)

    member.wait_until(refused, 60, "the refusal in /state nodeHealth")
    assert "REFUSED PEER" in member.log()
    time.sleep(2)
    assert outsider_id not in member.state()["topology"]["nodes"]
    seen = outsider.state()
    assert member_id not in seen["topology"]["nodes"]  # no event of the cluster reached it
    assert not member_instances & set(seen["instances"])
    assert "API IS OPEN" in outsider.log()
    assert all(e.get("origin") != member_id for e in outsider.get("/events").json()["events"])

    token = _token(world["tmp"], "owner")
    assert token.startswith("skulk1-")
    joiner = world["node"]("joiner", "stranger", *bootstrap, in_ns=True, env={"SKULK_JOIN_TOKEN": token}).wait_api(60)
    joiner_id = joiner.get("/node_id").json()
    member.wait_until(lambda: joiner_id in member.state()["topology"]["nodes"], 60, "the joiner in the topology")
    joiner.wait_until(
        lambda: member_instances <= set(joiner.state()["instances"]), 60, "the cluster's State on the joiner"
    )


CHAT = {"model": "skulk/echo", "max_tokens": 4, "messages": [{"role": "user", "content": "one two three"}]}
FORMATS = {
    "/v1/chat/completions": (CHAT, lambda b: b["error"]["code"] == "rate_limit_exceeded"),
    "/v1/responses": (
        {"model": "skulk/echo", "input": "one two three", "max_output_tokens": 4},
        lambda b: b["error"]["code"] == "rate_limit_exceeded",
    ),
    "/v1/messages": (
        {"model": "skulk/echo", "max_tokens": 4, "messages": [{"role": "user", "content": "one two"}]},
        lambda b: b["type"] == "error" and b["error"]["type"] == "rate_limit_error",
    ),
    "/api/chat": (
        {"model": "skulk/echo", "stream": False, "messages": [{"role": "user", "content": "one two"}]},
        lambda b: isinstance(b["error"], str),
    ),
}


def test_keys_scopes_revocation_and_quotas_from_another_host(world: dict[str, Any]) -> None:
    ns: Netns = world["ns"]
    a = world["node"]("a", "owner").wait_api()
    a.wait_ready("skulk/echo", 60)
    b = world["node"]("b", "owner", "--bootstrap-peers", f"127.0.0.1:{_zenoh_port(a)}").wait_api()
    b.wait_until(lambda: bool(b.ready_instances("skulk/echo")), 60, "b to see the instance")
    urls = [f"http://{ns.host_ip}:{n.api_port}" for n in (a, b)]

    for url in urls:  # no key from another host
        assert ns.http("POST", url + "/v1/chat/completions", body=CHAT)[0] == 401
        assert ns.http("GET", url + "/state")[0] == 401
    assert a.get("/state").status_code == 200  # loopback needs none
    inference = a.post("/v1/keys", json={"name": "laptop"}).json()["key"]
    operator = a.post("/v1/keys", json={"name": "ops", "scope": "operator"}).json()["key"]
    assert inference not in json.dumps(a.state())  # only hashes are replicated
    b.wait_until(lambda: len(b.get("/v1/keys").json()["keys"]) == 2, 10, "the keys on b")
    for url in urls:
        assert ns.http("POST", url + "/v1/chat/completions", inference, CHAT)[0] == 200
        status, _, body = ns.http("GET", url + "/state", inference)
        assert status == 403 and body["error"]["code"] == "insufficient_scope"
        assert ns.http("POST", url + "/v1/chat/completions", operator, CHAT)[0] == 200
        assert ns.http("GET", url + "/state", operator)[0] == 200
    # WebSockets pass the same gate: the capability stream needs an operator key (a 403 handshake)
    socket = urls[0].replace("http://", "ws://") + "/v1/capabilities/stream"
    assert [ws_handshake(ns, socket, key) for key in (None, inference, operator)] == [403, 403, 101]
    # Ollama's model management changes what the cluster holds: operator keys only (docs/security.md)
    pull = {"model": "no-such-model", "stream": False}
    status, _, body = ns.http("POST", urls[0] + "/api/pull", inference, pull)
    assert status == 403 and "operator" in body["error"], body
    assert ns.http("DELETE", urls[0] + "/api/delete", inference, {"model": "skulk/echo"})[0] == 403
    assert ns.http("POST", urls[0] + "/api/pull", operator, pull)[0] == 404  # past the gate: the route answers
    rerank = {"model": "skulk/echo", "query": "q", "documents": ["d"]}
    assert ns.http("POST", urls[0] + "/v1/rerank", inference, rerank)[0] == 400  # an inference route
    status, _, body = ns.http("POST", urls[0] + "/v1/chat/completions", "skulk-00000000-nope", CHAT)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"

    # revoked on a, refused everywhere within 2 s
    key_id = next(k["id"] for k in a.get("/v1/keys").json()["keys"] if k["name"] == "laptop")
    revoked_at = time.monotonic()
    assert ns.http("DELETE", urls[1] + f"/v1/keys/{key_id}", operator)[0] == 200
    for url in urls:
        while ns.http("POST", url + "/v1/chat/completions", inference, CHAT)[0] != 401:
            assert time.monotonic() - revoked_at < 2.0, f"the revoked key still works on {url}"
    assert time.monotonic() - revoked_at < 2.0

    # quotas: 10 tokens per minute, spent through a and b; every format answers 429 natively
    limited = a.post("/v1/keys", json={"name": "metered", "tokens_per_min": 10}).json()["key"]
    b.wait_until(lambda: "metered" in {k["name"] for k in b.get("/v1/keys").json()["keys"]}, 10, "the metered key on b")
    for url in urls:
        assert ns.http("POST", url + "/v1/chat/completions", limited, CHAT)[0] == 200  # 3 prompt + 3 output each
    time.sleep(2.5)  # a peer's count arrives within about a second
    for path, (body, native) in FORMATS.items():
        for url in urls:
            status, headers, answer = ns.http("POST", url + path, limited, body)
            assert status == 429, (path, url, status, answer)
            assert 1 <= int(headers["retry-after"]) <= 60 and native(answer), (path, answer)
    assert ns.http("POST", urls[0] + "/v1/chat/completions", operator, CHAT)[0] == 200  # other keys unaffected
