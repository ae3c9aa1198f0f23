"""Load deadlines with a real node and real runner processes: a load that never finishes.

The echo engine's `hang_model` option offers `skulk/echo-hang`, whose `load` sleeps forever. With a
2 s deadline the runner is killed, the instance fails with the reason and is placed again; the new
runner hangs too, misses its deadline a second time (`load_retries = 1`), and the model is then
placed without this node, which on a single node finds no room: the master gives up after
`replace_retry_s`. So the failures stop at two.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from skulk_engine_echo.engine import ECHO_MODEL, echo_cards
from skulk_kernel.api import RankGroup
from skulk_testing.conformance import make_runner_spec
from skulk_worker.plugin import WorkerConfig
from skulk_worker.supervisor import GIB, load_deadline_s

HANG = "skulk/echo-hang"
PROFILE = """
[profile]
name = "load-deadline-test"
plugins = ["master", "worker", "engine-echo", "store", "api-control"]

[plugins.master]
default_models = ["skulk/echo-hang"]
replace_retry_s = 2.0

[plugins.worker]
load_timeout_s = 2.0
load_retries = 1

[plugins.engine-echo]
hang_model = true
"""


def test_the_deadline_is_the_floor_or_scaled_by_the_weights_share_plus_group_formation():
    config = WorkerConfig(load_timeout_s=600, load_s_per_gib=30)
    card = echo_cards()[ECHO_MODEL].model_copy(update={"storage_size": 40 * GIB, "n_layers": 8})
    whole = make_runner_spec(card)
    assert load_deadline_s(make_runner_spec(echo_cards()[ECHO_MODEL]), config) == 600  # tiny: the floor
    assert load_deadline_s(whole, config) == 1200  # 40 GiB x 30 s
    half = replace(whole, shard=whole.shard.model_copy(update={"end_layer": 4}))
    assert load_deadline_s(half, config) == 600  # a pipeline rank with half the layers: 20 GiB -> 600 s
    grouped = replace(whole, group=RankGroup(hosts=("a:1", "b:2"), formation_deadline_s=120))
    assert load_deadline_s(grouped, config) == 1200 + 120  # a rank forms its group first, inside load()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too (the node reaps it on join)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_load_that_hangs_fails_after_its_deadline_and_is_placed_again(node_factory, tmp_path: Path):
    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE)
    node = node_factory(str(profile)).wait_api()
    pids: set[int] = set()
    instances: set[str] = set()

    def failures() -> list[dict]:
        state = node.state()
        for wrapped in state["instances"].values():
            inst = next(iter(wrapped.values()))
            if inst["shardAssignments"]["modelId"] == HANG:
                instances.add(inst["instanceId"])
        diag = node.get("/v1/diagnostics/node").json()
        pids.update(r["pid"] for r in diag.get("supervisorRunners", []) if r["pid"] and r["modelId"] == HANG)
        return [f for f in state["instanceFailures"] if f["modelId"] == HANG]

    node.wait_until(lambda: len(failures()) >= 2, 30, "two load-deadline failures")
    first, second = failures()[:2]
    assert first["instanceId"] != second["instanceId"], "the failed instance was not placed again"
    assert {first["instanceId"], second["instanceId"]} <= instances
    for failure in (first, second):
        assert re.search(r"did not finish loading skulk/echo-hang within 2 s \(deadline scaled by", failure["reason"])
    assert first["reason"].endswith("; placing it again"), first["reason"]
    assert "placing it again without node" in second["reason"], second["reason"]

    # both runners were killed and reaped: no orphan holds the (would-be) weights
    assert len(pids) >= 2, f"saw runner pids {pids}"
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "a runner outlived its load deadline"

    # bounded: excluded from its only node, the model is not placed a third time; the master gives up
    node.wait_until(lambda: "gave up re-placing skulk/echo-hang" in node.log(), 10, "the master to give up")
    assert len(failures()) == 2
    assert not any(
        next(iter(w.values()))["shardAssignments"]["modelId"] == HANG for w in node.state()["instances"].values()
    )
    waited = [float(s) for s in re.findall(r"killing pid \d+ after ([\d.]+) s", node.log())]
    assert len(waited) == 2 and all(2.0 <= w < 5.0 for w in waited), waited
    print(f"load start -> kill: {waited} s")
