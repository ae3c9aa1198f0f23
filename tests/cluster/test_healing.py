"""Issue [scale], healing at the speed of detection: kill -9 of the node that holds a model's only
instance, three real nodes, on each control plane. The master re-places the instance as soon as the
transport has closed the node's session and its heartbeats stopped (`departed_after_s`, 3 s), not
after the 30 s prune timeout meant for silent nodes.

On Zenoh the dead node is a worker; on libp2p it is the master, so a survivor is elected first and
then heals (the two cases the issue measured at 35.5 s and 36.7 s).
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from .conftest import instance_nodes, lone_instance

pytestmark = pytest.mark.slow

HEAL_BUDGET_S = 8.0  # acceptance: serving again within 8 s plus the model's load time


def chat(node, content: str, timeout: float = 10) -> httpx.Response:
    return httpx.post(
        node.url + "/v1/chat/completions",
        timeout=timeout,
        json={"model": "skulk/echo", "messages": [{"role": "user", "content": content}]},
    )


def test_kill_9_of_the_only_instances_host_heals_within_seconds(cluster_factory, control):
    cluster = cluster_factory(default_models=())  # node_timeout_s stays 30 s: healing must not wait for it
    host, host_id, api, instance_id, load_s = lone_instance(cluster, "skulk/echo")

    if control == "zenoh":
        # a node that stalls for a moment (under the transport's lease) keeps its place: no prune
        host.kill(signal.SIGSTOP)
        time.sleep(1.0)
        host.kill(signal.SIGCONT)
        time.sleep(4.0)
        assert instance_id in api.ready_instances(), "a one-second stall cost the instance its place"

    host.kill()
    killed = time.monotonic()
    refusals: list[str] = []
    healed_after = None
    while time.monotonic() - killed < HEAL_BUDGET_S + load_s + 20:  # bounded; asserted tighter below
        try:
            answer = chat(api, "healed?")
        except httpx.HTTPError as exc:
            refusals.append(repr(exc))
        else:
            if answer.status_code == 200:
                assert answer.json()["choices"][0]["message"]["content"] == "healed?"
                healed_after = time.monotonic() - killed
                break
            assert answer.status_code in (503, 504), answer.text  # retryable while the master heals
            refusals.append(answer.text)
        time.sleep(0.25)
    assert healed_after is not None, f"never served again: {refusals[-3:]}"
    print(f"{control}: served again {healed_after:.1f} s after kill -9 (load {load_s:.1f} s), {len(refusals)} refusals")
    assert healed_after < HEAL_BUDGET_S + load_s, f"healed after {healed_after:.1f}s (load {load_s:.1f}s)"
    assert not any("times out (30s)" in r for r in refusals), refusals[:2]

    # exactly one instance of the model, on a survivor; the prune names the early path
    survivors = cluster.alive()
    master_id, _ = cluster.wait_agreed(30, survivors)
    state = api.state()
    echo = [i for i, nodes in instance_nodes(state).items()]
    assert len(echo) == 1 and host_id not in instance_nodes(state)[echo[0]], state["instances"]
    assert host_id not in state["topology"]["nodes"]
    master_log = cluster.by_id(master_id).log()
    assert "session closed, silent" in master_log
