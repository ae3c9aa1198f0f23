"""How the cluster's cost grows with its size: N lightweight nodes on this host, N = 4, 8, 16, 32.

Run: ``python bench/bench_scale.py [--sizes 4,8,16,32] [--api 3] [--out bench/results]``; writes
``scale.json`` and ``scale.md`` (a table per N) under --out and prints the table.

Each node is its own ``skulk-kernel run`` process with its own SKULK_HOME, the echo engine and
Zenoh on every plane, all in one cluster (a fresh network version per N). The first node has an API
and ``--force-master`` (so the master is a node this harness can watch); ``--api - 1`` more have an
API; the rest run ``--no-api``, the lightest node there is. Per N it measures:

* join: the first spawn to every API node agreeing on one master, N members and one State hash
  (spawned in waves of 4, each wave once the previous one has started: on two cores, 32 Python
  interpreters importing at once starve each other's transport leases);
* idle, over ``--idle-s`` after a settle: CPU per node (a process's user + system time over the
  window, percent of one core; median of the followers and the master's own), and the messages a
  node sends and receives per second on each plane (transport counters of the API followers);
* ``/state`` size in bytes;
* burst: ``--commands`` PUT /v1/tracing from 4 threads; how long from the last answer until every
  API node reports the master's State hash;
* late joiner: one more API node; spawn to its first ``/node_id``, and from then until its State
  hash equals the master's (the sync proper);
* election: kill -9 of the master until every surviving API node names one new master.

Only nodes with an API can be asked for their hash and counters: "every node agrees" is measured
on the API nodes (the rest run the same code on the same messages). The machine is shared and
small; the figures that matter are the slopes against N, not the absolute values.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testing" / "src"))

from skulk_testing.isolation import cluster_env  # noqa: E402
from skulk_testing.nodes import NodeProcess, start_node  # noqa: E402

PROFILE = """
[profile]
name = "scale-bench"
plugins = ["transport-zenoh", "election-bully", "master", "worker", "engine-echo", "store",
           "api-control", "api-openai"]

[planes]
control = "zenoh"

[plugins.master]
default_models = []
"""


WAVE = 4  # nodes spawned together


def _diag(node: NodeProcess) -> dict[str, Any]:
    return node.get("/v1/diagnostics/node", timeout=10).json()


def _until(check: Any, timeout: float, what: str, step: float = 0.1) -> float:
    """Seconds until check() is truthy (raises TimeoutError after `timeout`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if check():
                return time.monotonic() - t0
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            pass
        time.sleep(step)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


class Fleet:
    """N node processes of one cluster; stopped for sure by stop()."""

    def __init__(self, n: int, api: int, tmp: Path, relaxed_s: float | None = None) -> None:
        self.tmp, self.version = tmp, f"scale-{uuid.uuid4().hex[:10]}"
        self.profile = tmp / "profile.toml"
        extra = (
            f"\n[plugins.election-bully]\nmaster_timeout_s = {relaxed_s}\n"
            f"\n[plugins.transport-zenoh]\nlease_s = {relaxed_s}\n"
            if relaxed_s
            else ""
        )
        self.profile.write_text(PROFILE + extra)
        self.nodes: list[NodeProcess] = []
        self.api: list[NodeProcess] = []
        # One cluster secret for the fleet, given to every node: without it each node reads or
        # creates ~/.skulk/cluster.secret, and nodes of the first wave racing to create it end up
        # with different secrets (their frames rejected as forged, sessions flapping).
        self.secret = cluster_env()
        for i in range(n):
            self.spawn(with_api=i < api, first=i == 0)
            if (i + 1) % WAVE == 0:  # a wave at a time: 32 interpreters importing at once starve every lease
                for node in self.nodes[-WAVE:]:
                    _until(lambda x=node: "started with profile" in x.log(), 120, "a node to start")

    def spawn(self, with_api: bool, first: bool = False) -> NodeProcess:
        args = ["--node-name", f"s{len(self.nodes)}", "--no-default-models"]
        args += ["--force-master"] if first else []
        args += [] if with_api else ["--no-api"]
        node = start_node(
            str(self.profile),
            *args,
            home=self.tmp / f"node{len(self.nodes)}",
            env={"SKULK_NETWORK_VERSION": self.version, **self.secret},
        )
        self.nodes.append(node)
        if with_api:
            self.api.append(node)
        return node

    def alive_api(self) -> list[NodeProcess]:
        return [n for n in self.api if n.proc is not None and n.proc.poll() is None]

    def agreed(self, n: int, nodes: list[NodeProcess] | None = None) -> str | None:
        views = [_diag(a) for a in nodes or self.alive_api()]
        masters = {v["runtime"]["masterNodeId"] for v in views}
        hashes = {v["stateHash"] for v in views}
        members = {len(a.state()["topology"]["nodes"]) for a in nodes or self.alive_api()}
        if len(masters) == 1 and None not in masters and len(hashes) == 1 and members == {n}:
            return masters.pop()
        return None

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        for node in self.nodes:
            node.stop(timeout=5)


def _cpu_s(node: NodeProcess) -> float:
    try:
        t = psutil.Process(node.pid()).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def _messages(nodes: list[NodeProcess]) -> dict[str, dict[str, dict[str, int]]]:
    """node url -> plane -> {sent, received}."""
    out = {}
    for node in nodes:
        transports = _diag(node)["transports"]
        planes: dict[str, dict[str, int]] = {}
        for plane, described in transports.items():
            counts = described.get("messages", {}).get(plane, {"sent": 0, "received": 0})
            planes[plane] = counts
        out[node.url] = planes
    return out


def idle(fleet: Fleet, master: NodeProcess, window_s: float) -> dict[str, Any]:
    followers_api = [a for a in fleet.alive_api() if a is not master]
    cpu0 = {n.url: _cpu_s(n) for n in fleet.nodes}
    msg0 = _messages([master, *followers_api])
    t0 = time.monotonic()
    time.sleep(window_s)
    dt = time.monotonic() - t0
    cpu1 = {n.url: _cpu_s(n) for n in fleet.nodes}
    msg1 = _messages([master, *followers_api])
    pct = {u: 100 * (cpu1[u] - cpu0[u]) / dt for u in cpu0}
    followers = [pct[n.url] for n in fleet.nodes if n is not master]

    def rate(url: str, plane: str, way: str) -> float:
        return (msg1[url][plane][way] - msg0[url][plane][way]) / dt

    per_plane: dict[str, dict[str, float]] = {}
    for plane in ("control", "telemetry"):
        sent = [rate(a.url, plane, "sent") for a in followers_api]
        received = [rate(a.url, plane, "received") for a in followers_api]
        per_plane[plane] = {
            "follower_sent_per_s": round(statistics.median(sent), 2) if sent else None,
            "follower_received_per_s": round(statistics.median(received), 2) if received else None,
            "master_sent_per_s": round(rate(master.url, plane, "sent"), 2),
            "master_received_per_s": round(rate(master.url, plane, "received"), 2),
        }
    return {
        "window_s": round(dt, 1),
        "cpu_pct_follower_median": round(statistics.median(followers), 2),
        "cpu_pct_follower_max": round(max(followers), 2),
        "cpu_pct_master": round(pct[master.url], 2),
        "cpu_pct_all_nodes": round(sum(pct.values()), 1),
        "messages": per_plane,
    }


def burst(fleet: Fleet, master: NodeProcess, commands: int) -> dict[str, Any]:
    apis = fleet.alive_api()
    per = commands // 4

    def toggles(k: int) -> None:
        with httpx.Client(base_url=apis[k % len(apis)].url, timeout=30) as client:
            for i in range(per):
                client.put("/v1/tracing", json={"enabled": (k + i) % 2 == 0})

    t0 = time.monotonic()
    threads = [threading.Thread(target=toggles, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    sent_s = time.monotonic() - t0
    target = _diag(master)["lastEventAppliedIdx"]

    def same() -> bool:
        views = [_diag(a) for a in apis]
        return len({v["stateHash"] for v in views}) == 1 and all(v["lastEventAppliedIdx"] >= target for v in views)

    return {"commands": per * 4, "sent_s": round(sent_s, 2), "agreed_after_s": round(_until(same, 60, "hashes"), 2)}


def late_joiner(fleet: Fleet, master: NodeProcess) -> dict[str, Any]:
    t0 = time.monotonic()
    joiner = fleet.spawn(with_api=True)
    joiner.wait_api(120)
    up_s = time.monotonic() - t0

    def synced() -> bool:
        return _diag(joiner)["stateHash"] == _diag(master)["stateHash"] and _diag(joiner)["runtime"]["masterNodeId"]

    return {"spawn_to_api_s": round(up_s, 2), "sync_s": round(_until(synced, 60, "late joiner", 0.05), 2)}


def election(fleet: Fleet, master: NodeProcess, old_id: str) -> dict[str, Any]:
    master.kill()
    rest = [a for a in fleet.alive_api() if a is not master]

    def new_master() -> bool:
        named = {_diag(a)["runtime"]["masterNodeId"] for a in rest}
        return len(named) == 1 and None not in named and old_id not in named

    return {"elected_after_s": round(_until(new_master, 60, "new master", 0.05), 2)}


def one_size(n: int, api: int, idle_s: float, commands: int, master_timeout_s: float | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"skulk-scale-{n}-"))
    t0 = time.monotonic()
    fleet = Fleet(n, min(api, n), tmp, master_timeout_s)
    try:
        master = fleet.api[0]
        master.wait_api(300)
        _until(lambda: fleet.agreed(n), 600, f"{n} nodes to join", 0.3)
        join_s = time.monotonic() - t0
        master_id = _diag(master)["runtime"]["masterNodeId"]
        assert master_id == master.get("/node_id").json(), "the --force-master node is not master"
        time.sleep(5)  # the join's burst of readings and edges settles
        result: dict[str, Any] = {"n": n, "api_nodes": len(fleet.api), "join_s": round(join_s, 2)}
        result["master_timeout_and_lease_s"] = master_timeout_s or 3.0
        result["idle"] = idle(fleet, master, idle_s)
        result["state_bytes"] = len(master.get("/state", timeout=30).content)
        result["burst"] = burst(fleet, master, commands)
        result["late_joiner"] = late_joiner(fleet, master)
        result["election"] = election(fleet, master, master_id)
        rss = [psutil.Process(x.pid()).memory_info().rss for x in fleet.nodes if x.proc and x.proc.poll() is None]
        result["rss_mib_median"] = round(statistics.median(rss) / 2**20, 1)
        return result
    finally:
        fleet.stop()


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| N | join s | election s | hashes agree s (after 1,000 cmds) | late joiner sync s | "
        "CPU % follower / master | ctl msg/s sent / recv (follower) | tel msg/s sent / recv (follower) | "
        "master recv/s ctl+tel | /state bytes |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        i, m = r["idle"], r["idle"]["messages"]
        c, t = m["control"], m["telemetry"]
        lines.append(
            f"| {r['n']} | {r['join_s']} | {r['election']['elected_after_s']} | {r['burst']['agreed_after_s']} | "
            f"{r['late_joiner']['sync_s']} | {i['cpu_pct_follower_median']} / {i['cpu_pct_master']} | "
            f"{c['follower_sent_per_s']} / {c['follower_received_per_s']} | "
            f"{t['follower_sent_per_s']} / {t['follower_received_per_s']} | "
            f"{round(c['master_received_per_s'] + t['master_received_per_s'], 1)} | {r['state_bytes']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,8,16,32")
    parser.add_argument("--api", type=int, default=3, help="nodes with an API (the first is the master)")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--commands", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--relaxed-s",
        type=float,
        default=None,
        help="the election's master_timeout_s and Zenoh's lease_s (both 3 s by default): for a host too small "
        "to keep N nodes' leases alive through the join",
    )
    parser.add_argument("--name", default="scale", help="file name of the report (NAME.json, NAME.md)")
    args = parser.parse_args()
    results, errors = [], {}
    for n in (int(x) for x in args.sizes.split(",")):
        print(f"--- {n} nodes", flush=True)
        try:
            results.append(one_size(n, args.api, args.idle_s, args.commands, args.relaxed_s))
            print(json.dumps(results[-1]), flush=True)
        except Exception as exc:  # one size that cannot run is recorded, the others still are
            errors[str(n)] = f"{type(exc).__name__}: {str(exc)[:500]}"
            print(f"{n} nodes failed: {errors[str(n)]}", flush=True)
    report = {
        "what": "N echo nodes on one host (zenoh on every plane); see bench/bench_scale.py",
        "cpus": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "results": results,
        "errors": errors,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = table(results)
    (args.out / f"{args.name}.md").write_text(f"# bench_scale ({report['at']}, {report['cpus']} CPUs)\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
