"""llama.cpp RPC carried only between members, seen from another network namespace (issue [rpc] 3).

On the host: a real ``ggml-rpc-server`` on loopback and the rank's member tunnel in front of it on
the host's veth address, exactly as a rank runs them. From the namespace (another "machine"):

* the RPC port itself cannot be reached (it listens on 127.0.0.1 only);
* a process holding another cluster's secret cannot open the tunnel (the TLS handshake fails; no
  connection reaches the rpc-server);
* a member (the same secret) opens it, and the RPC build's ``llama-server`` in the namespace, driving
  the host's rpc-server through it, answers a chat completion with the layers held on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from skulk_testing.netns import Netns

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2"),
]

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"

DRIVER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from skulk_engine_llamacpp.events import TextDelta
    from skulk_engine_llamacpp.rpc_build import find_build
    from skulk_engine_llamacpp.rpc_engine import RpcLlamaServer
    from skulk_engine_llamacpp.rpc_tunnel import MemberTls, Tunnels

    remote, model = sys.argv[1], sys.argv[2]
    tunnels = Tunnels(MemberTls.of_this_node())
    try:
        tunnels.wait_reachable(remote, 5)
    except Exception as exc:
        print(json.dumps({"reached": False, "error": str(exc)}))
        raise SystemExit(0)
    local = tunnels.reach(remote)
    server = RpcLlamaServer(find_build(), [f"127.0.0.1:{local}"], 30, [30], model_path=Path(model), n_ctx=1024)
    server.start()
    try:
        ask = [{"role": "user", "content": "Name a color."}]
        events = server.chat(ask, sampling={"temperature": 0, "max_tokens": 8})
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        print(json.dumps({"reached": True, "text": text, "up": tunnels.stats.bytes_up}))
    finally:
        server.close()
        tunnels.close()
    """
)


@pytest.fixture(scope="module")
def rpc_build() -> Any:
    from skulk_engine_llamacpp.rpc_build import RpcBuildError, ensure_rpc_build

    try:
        return ensure_rpc_build("cpu")
    except (RpcBuildError, OSError) as exc:
        pytest.skip(f"no RPC build of llama.cpp here: {exc}")


@pytest.fixture
def rank(rpc_build: Any) -> Iterator[dict[str, Any]]:
    """A rank on the host: rpc-server on loopback, its member tunnel on the host's veth address."""
    from skulk_engine_llamacpp.rpc_engine import _stop, _wait_port, free_loopback_port
    from skulk_engine_llamacpp.rpc_tunnel import MemberTls, Tunnels

    ns = Netns().up()
    port = free_loopback_port()
    process = subprocess.Popen(
        [str(rpc_build.rpc_server), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tunnels = Tunnels(MemberTls.of_this_node())
    try:
        _wait_port(port, process, 30, "ggml-rpc-server")
        tunnel_port = tunnels.expose(f"{ns.host_ip}:0", port)
        yield {"ns": ns, "rpc_port": port, "tunnel": f"{ns.host_ip}:{tunnel_port}", "tunnels": tunnels}
    finally:
        tunnels.close()
        _stop(process)
        ns.down()


def in_ns(ns: Netns, token: str, *argv: str, timeout: float = 240) -> dict[str, Any]:
    env = {**os.environ, "SKULK_JOIN_TOKEN": token}
    done = subprocess.run(ns.command(*argv), env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_rpc_is_reached_only_through_a_members_tunnel(rank: dict[str, Any], models_dir: Path) -> None:
    import secrets as random

    from skulk_transport_zenoh.secret import encode_token

    ns: Netns = rank["ns"]
    member = os.environ["SKULK_JOIN_TOKEN"]  # this test process's cluster (skulk_testing.isolation)
    outsider = encode_token(random.token_bytes(32))
    probe = (
        "import json, socket, sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
        "    print(json.dumps({'open': True}))\n"
        "except OSError as exc:\n"
        "    print(json.dumps({'open': False, 'error': str(exc)}))\n"
    )
    host = ns.host_ip
    assert in_ns(ns, member, sys.executable, "-c", probe, host, str(rank["rpc_port"])) == {
        "open": False,
        "error": "[Errno 111] Connection refused",
    }, "the RPC port is reachable from another machine"

    folder = models_dir / SMOLLM2.replace("/", "--")
    model = folder / json.loads((folder / ".skulk" / "installed-card.json").read_text())["main_file"]
    refused = in_ns(ns, outsider, sys.executable, "-c", DRIVER, rank["tunnel"], str(model))
    assert refused["reached"] is False, refused
    stats = rank["tunnels"].stats
    assert stats.connections == 0 and stats.bytes_up == 0, f"an outsider reached the rpc-server: {stats}"

    served = in_ns(ns, member, sys.executable, "-c", DRIVER, rank["tunnel"], str(model))
    assert served["reached"] is True and served["text"].strip(), served
    assert rank["tunnels"].stats.bytes_up > 50 * 2**20, "the weights did not cross the tunnel to the host's rank"
