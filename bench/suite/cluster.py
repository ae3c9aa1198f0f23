"""Section 5, cluster: remote-API per-token overhead, command latency, join time vs log length, failover.

Runs only when `skulk-kernel plugins` lists a transport (`transport-zenoh`) and an election
(`election-bully`); otherwise the section is recorded as skipped.

The nodes serve the deterministic echo engine (`skulk/echo`, no model files, no per-token delay)
whatever the suite's main model is: the engine then costs next to nothing per token, so what is
measured is Skulk's own path (API, kernel, data plane over Zenoh), and node start-ups stay short.
All nodes run on this host over loopback TCP with multicast scouting off (they connect to the
seed node's listen endpoint) and a network version unique to the run, so concurrent test
clusters on the same host never mix with them. Transport and election settings are the defaults
(Zenoh lease 3 s; bully campaign 1 s, heartbeat 0.5 s, master timeout 3 s).

* per-token overhead: the same requests alternately through the seed node's API (the runner is
  local to it) and through a second node's API (its tokens cross the data plane). Two figures:
  the latency every token gains from the extra hop (TTFT p50 remote - local: each token crosses
  the hop once), and the path's per-token cost at full speed (ms per token from token timestamps
  after the first, with an engine that does not wait between tokens; on 2 cores the remote path
  can be *faster* here, because the work is split over two processes).
* command latency: ``PUT /v1/tracing`` (a SetTracingEnabled command; the route returns once the
  event is applied on the node that took the request), on the master and on a follower.
* join time vs log length: a fresh node's spawn -> API up -> its State at the master's index.
* failover: a clean stop (SIGTERM, goodbye) and a kill -9 of the master -> the survivors agree on
  a new master; -> a command is applied through it; -> after it is asked to place the model again
  (the instance lived on the old master), the first token through a survivor.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
from skulk_testing.nodes import NodeProcess, free_port

from . import nodes
from .common import Section, log, percentile, ratio, summarize
from .harness import Bench
from .streams import StreamResult, new_client, stream_once

REQUIRED = ("transport-zenoh", "election-bully")
ENGINE = "engine-echo"
MODEL = "skulk/echo"
PLUGINS = ["transport-zenoh", "election-bully", "master", "worker", ENGINE, "store", "api-control", "api-openai"]


def _profile(bench: Bench, name: str, version: str, listen: str, connect: list[str]) -> str:
    path = bench.scratch / f"{name}.toml"
    path.write_text(
        nodes.profile_toml(
            name,
            PLUGINS,
            {"control": "zenoh", "data": "zenoh"},
            {
                "master": {"default_models": [MODEL]},
                "transport-zenoh": {
                    "listen": [listen],
                    "connect": connect,
                    "multicast_scouting": False,
                    "network_version": version,
                },
            },
            "bench cluster node (written by bench/run.py)",
        )
    )
    return str(path)


def _runtime(node: NodeProcess) -> dict[str, Any]:
    return node.get("/v1/diagnostics/node", timeout=2).json()


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


class Cluster:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.version = f"bench-{os.getpid()}-{int(time.time())}"
        self.port = free_port()
        self.seed_profile = _profile(bench, "bench-cluster-seed", self.version, f"tcp/127.0.0.1:{self.port}", [])
        self.join_profile = _profile(
            bench, "bench-cluster-join", self.version, "tcp/127.0.0.1:0", [f"tcp/127.0.0.1:{self.port}"]
        )
        self.members: list[NodeProcess] = []
        self.count = 0

    def start_seed(self) -> NodeProcess:
        t0 = time.perf_counter()
        node = nodes.start(
            self.seed_profile,
            "--force-master",
            "--node-name",
            "bench-seed",
            home=nodes.scratch_dir("seed"),
            env=self.bench.env(),
        )
        node.wait_api(timeout=self.bench.settings.startup_timeout_s)
        node.wait_ready(MODEL, timeout=self.bench.settings.startup_timeout_s)
        self.seed_ready_s = time.perf_counter() - t0
        self.members.append(node)
        return node

    def join(self, master: NodeProcess) -> tuple[NodeProcess, dict[str, Any]]:
        """Start one more node; time spawn -> API -> State caught up with the master's index."""
        self.count += 1
        target = _runtime(master)["lastEventAppliedIdx"]
        master_id = master.get("/node_id").json()
        t0 = time.perf_counter()
        node = nodes.start(
            self.join_profile,
            "--node-name",
            f"bench-join-{self.count}",
            home=nodes.scratch_dir(f"join{self.count}"),
            env=self.bench.env(),
        )
        nodes.wait_for(
            lambda: node.get("/node_id", timeout=1).status_code == 200,
            self.bench.settings.startup_timeout_s,
            "the joining node's API",
            0.05,
        )
        api_s = time.perf_counter() - t0

        def synced() -> bool:
            rt = _runtime(node)
            return rt["lastEventAppliedIdx"] >= target and rt["runtime"]["masterNodeId"] == master_id

        nodes.wait_for(synced, min(60.0, self.bench.settings.startup_timeout_s), "the joining node to catch up", 0.05)
        total = time.perf_counter() - t0
        self.members.append(node)
        return node, {
            "log_length": target + 1,
            "api_up_s": round(api_s, 3),
            "synced_s": round(total, 3),
            "sync_after_api_s": round(total - api_s, 3),
        }

    def leave(self, node: NodeProcess) -> None:
        node.stop()
        if node in self.members:
            self.members.remove(node)


def _grow_log(master: NodeProcess, target: int, threads: int = 6) -> dict[str, Any]:
    """Requests of one token to the echo model until the master's log reaches `target` events."""
    t0 = time.perf_counter()
    start_idx = _runtime(master)["lastEventAppliedIdx"]
    stop = threading.Event()
    sent = [0]

    def worker(k: int) -> None:
        with new_client(4) as client:
            i = 0
            while not stop.is_set():
                i += 1
                stream_once(client, master.url, "chat", MODEL, f"grow {k} {i}", 1, timeout=30)
                sent[0] += 1

    pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    try:
        nodes.wait_for(lambda: _runtime(master)["lastEventAppliedIdx"] + 1 >= target, 180, "the log to grow", 0.2)
    finally:
        stop.set()
        for t in pool:
            t.join(30)
    end_idx = _runtime(master)["lastEventAppliedIdx"]
    took = time.perf_counter() - t0
    return {
        "from": start_idx + 1,
        "to": end_idx + 1,
        "requests": sent[0],
        "seconds": round(took, 2),
        "events_per_s": round((end_idx - start_idx) / took, 1) if took else None,
    }


def _command_latency(node: NodeProcess, count: int) -> tuple[list[float], int]:
    """Milliseconds per applied command; gives up after 3 failures in a row. Returns (times, failures)."""
    out: list[float] = []
    failures = streak = 0
    with httpx.Client(timeout=12) as client:
        enabled = bool(client.get(node.url + "/v1/tracing").json()["enabled"])
        for _ in range(count):
            enabled = not enabled
            t0 = time.perf_counter()
            try:
                ok = client.put(node.url + "/v1/tracing", json={"enabled": enabled}).status_code == 200
            except httpx.HTTPError:
                ok = False
            took = time.perf_counter() - t0
            if ok:
                out.append(took * 1000)
                streak = 0
                continue
            failures += 1
            streak += 1
            if streak >= 3:
                break
            # not applied in time: start again from the value the node has
            enabled = bool(client.get(node.url + "/v1/tracing").json()["enabled"])
    return out, failures


def _agreed(survivors: list[NodeProcess]) -> str | None:
    views = []
    for node in survivors:
        try:
            views.append(_runtime(node)["runtime"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None
    masters = {v["masterNodeId"] for v in views}
    if len(masters) != 1:
        return None
    (master,) = masters
    leaders = [v["nodeId"] for v in views if v["isMaster"]]
    return master if leaders == [master] else None


def _errors(node: NodeProcess, limit: int = 3) -> list[str]:
    return [ln[-300:] for ln in node.log().splitlines() if " ERROR " in ln][:limit]


def _failover(cluster: Cluster, mode: str, recovery_timeout: float) -> dict[str, Any]:
    """Stop the master (SIGTERM: it says goodbye; SIGKILL: it just vanishes) and time the survivors:
    agreement on a new master, then a command applied through the new master (PUT /v1/tracing),
    then the first token through a survivor after asking the new master to place the model again
    (the old instance lived on the old master's worker)."""
    victims = [n for n in cluster.members if _runtime(n)["runtime"]["isMaster"]]
    if not victims:
        raise RuntimeError("no member reports itself master")
    victim = victims[0]
    survivors = [n for n in cluster.members if n is not victim]
    if not survivors:
        raise RuntimeError("failover needs at least two members")
    old = victim.get("/node_id").json()
    t0 = time.perf_counter()
    victim.kill(signal.SIGTERM if mode == "clean" else signal.SIGKILL)
    new = nodes.wait_for(lambda: (m := _agreed(survivors)) and m != old and m, 60, "a new master", 0.05)
    elected = time.perf_counter() - t0
    out: dict[str, Any] = {
        "mode": "SIGTERM (goodbye)" if mode == "clean" else "SIGKILL",
        "members_before": len(cluster.members),
        "elected_s": round(elected, 3),
        "command_applied_s": None,
        "first_token_s": None,
    }
    leader = next(n for n in survivors if n.get("/node_id").json() == new)
    deadline = time.monotonic() + recovery_timeout
    with httpx.Client(timeout=3) as client:
        while time.monotonic() < deadline:
            try:
                # the route returns at once when the value is already set: ask for the other one each time
                enabled = not client.get(leader.url + "/v1/tracing").json()["enabled"]
                if (
                    client.put(leader.url + "/v1/tracing", json={"enabled": enabled}).status_code == 200
                    and client.get(leader.url + "/v1/tracing").json()["enabled"] == enabled
                ):
                    out["command_applied_s"] = round(time.perf_counter() - t0, 3)
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        if out["command_applied_s"] is not None:
            try:
                placed = client.post(
                    leader.url + "/place_instance",
                    json={"model_id": MODEL},
                    timeout=max(0.5, deadline - time.monotonic()),
                )
                out["replace_status"] = placed.status_code
            except httpx.HTTPError as exc:
                out["replace_status"] = f"{type(exc).__name__}"
            with new_client() as streams:
                while time.monotonic() < deadline:
                    got = stream_once(
                        streams,
                        survivors[0].url,
                        "chat",
                        MODEL,
                        "after failover one two three",
                        3,
                        timeout=max(0.5, deadline - time.monotonic()),
                    )
                    if got.ok:
                        out["first_token_s"] = round(got.started_at + (got.ttft_s or 0) - t0, 3)
                        break
                    out["last_error"] = f"HTTP {got.status}: {(got.error or '')[:300]}"
                    time.sleep(0.1)
    if out["command_applied_s"] is None or out["first_token_s"] is None:
        out["note"] = (
            f"no {'command applied' if out['command_applied_s'] is None else 'token'} within "
            f"{recovery_timeout:.0f} s of the stop"
        )
        out["survivor_errors"] = [e for n in survivors for e in _errors(n)][:4]
    victim.stop()
    cluster.members.remove(victim)
    return out


def run(section: Section, bench: Bench) -> None:
    s = bench.settings
    installed = nodes.installed_plugins()
    missing = [p for p in REQUIRED if p not in installed]
    if missing:
        section.skip(f"skipped: cluster plugins not installed (missing: {', '.join(missing)})")
        return
    if ENGINE not in installed:
        section.skip(f"skipped: the cluster section serves the echo engine and {ENGINE} is not installed")
        return
    cluster = Cluster(bench)
    t_section = time.perf_counter()
    phases: dict[str, float] = {}
    section.results["phases_s"] = phases

    def phase(name: str) -> None:
        phases[name] = round(time.perf_counter() - t_section, 2)
        log(f"   [{name}]")

    section.context = {
        "engine": ENGINE,
        "model": MODEL,
        "plugins": {p: installed[p] for p in REQUIRED},
        "transport": "zenoh over loopback TCP, multicast scouting off, defaults otherwise",
        "network_version": cluster.version,
        "tokens_per_request": s.cluster_tokens,
    }
    try:
        seed = cluster.start_seed()
        section.results["seed_ready_s"] = round(cluster.seed_ready_s, 3)
        phase("seed ready")
        follower, first_join = cluster.join(seed)
        joins = [first_join]
        log(f"   joined at log length {first_join['log_length']}: {first_join['synced_s']} s")

        phase("second node joined")
        # -- per-token overhead through a remote API node ---------------------------------------------
        prompt = _words(s.cluster_tokens)
        local: list[StreamResult] = []
        remote: list[StreamResult] = []
        with new_client() as client:
            stream_once(client, seed.url, "chat", MODEL, "warm up", 4)
            stream_once(client, follower.url, "chat", MODEL, "warm up", 4)
            for r in range(s.cluster_rounds):
                order = ((seed, local), (follower, remote)) if r % 2 == 0 else ((follower, remote), (seed, local))
                for node, bucket in order:
                    bucket.append(
                        stream_once(client, node.url, "chat", MODEL, f"{r} {prompt}", s.cluster_tokens, timeout=30)
                    )

        def per_token_ms(results: list[Any]) -> float | None:
            spans = [(x.n_tokens - 1, x.decode_span_s) for x in results if x.ok and x.decode_span_s]
            n = sum(a for a, _ in spans)
            return sum(b for _, b in spans) / n * 1000 if n else None

        lp, rp = per_token_ms(local), per_token_ms(remote)
        lt = percentile([x.ttft_s * 1000 for x in local if x.ok and x.ttft_s], 50)
        rt = percentile([x.ttft_s * 1000 for x in remote if x.ok and x.ttft_s], 50)
        section.results["remote_api"] = {
            "local_ms_per_token": None if lp is None else round(lp, 4),
            "remote_ms_per_token": None if rp is None else round(rp, 4),
            "overhead_us_per_token": None if lp is None or rp is None else round((rp - lp) * 1000, 2),
            "local_ttft_ms_p50": None if lt is None else round(lt, 2),
            "remote_ttft_ms_p50": None if rt is None else round(rt, 2),
            "added_latency_ms_per_token": None if lt is None or rt is None else round(rt - lt, 2),
            "requests_each": s.cluster_rounds,
            "errors": [x.error for x in local + remote if not x.ok][:3],
        }
        section.add_ratio(
            "remote_vs_local_ms_per_token",
            ratio(rp, lp),
            "ms per token through the node hosting the runner (local API)",
        )
        section.add_ratio("remote_vs_local_ttft", ratio(rt, lt), "TTFT p50 through the local API")
        section.row("ms/token local API (echo)", section.results["remote_api"]["local_ms_per_token"], "ms")
        section.row(
            "ms/token remote API node",
            section.results["remote_api"]["remote_ms_per_token"],
            "ms",
            baseline=section.results["remote_api"]["local_ms_per_token"],
            ratio=ratio(rp, lp),
        )
        section.row(
            "TTFT p50 remote API node",
            section.results["remote_api"]["remote_ttft_ms_p50"],
            "ms",
            baseline=section.results["remote_api"]["local_ttft_ms_p50"],
            ratio=ratio(rt, lt),
        )

        phase("remote API measured")
        # -- command latency ---------------------------------------------------------------------------
        on_master, failed_master = _command_latency(seed, s.cluster_commands)
        on_follower, failed_follower = _command_latency(follower, s.cluster_commands)
        cm, cf = summarize(on_master, 2), summarize(on_follower, 2)
        section.results["command_latency_ms"] = {
            "on_master": cm,
            "on_follower": cf,
            "failed": {"on_master": failed_master, "on_follower": failed_follower},
            "command": "PUT /v1/tracing (SetTracingEnabled), applied",
        }
        section.add_ratio(
            "command_latency_follower_vs_master_p50", ratio(cf["p50"], cm["p50"]), "command latency p50 on the master"
        )
        section.row("command latency p50/p99 on master", f"{cm['p50']}/{cm['p99']}", "ms")
        section.row(
            "command latency p50/p99 on follower", f"{cf['p50']}/{cf['p99']}", "ms", ratio=ratio(cf["p50"], cm["p50"])
        )

        phase("command latency measured")
        # -- join time vs log length -------------------------------------------------------------------
        growth = []
        for target in s.cluster_log_targets:
            if target <= joins[-1]["log_length"]:
                continue
            growth.append(_grow_log(seed, target))
            node, joined = cluster.join(seed)
            joins.append(joined)
            log(f"   joined at log length {joined['log_length']}: {joined['synced_s']} s")
            if len(s.cluster_failover) < 2 or target != s.cluster_log_targets[-1]:
                cluster.leave(node)
        section.results["joins"] = joins
        section.results["log_growth"] = growth
        first, last = joins[0], joins[-1]
        section.add_ratio(
            "join_time_longest_vs_shortest_log",
            ratio(last["synced_s"], first["synced_s"]) if len(joins) > 1 else None,
            f"join time at log length {first['log_length']}",
            note=f"log lengths {first['log_length']} -> {last['log_length']}",
        )
        for j in joins:
            section.row(
                f"join at log length {j['log_length']}",
                j["synced_s"],
                "s",
                baseline=first["synced_s"],
                ratio=ratio(j["synced_s"], first["synced_s"]),
            )

        phase("joins measured")
        # -- failover ----------------------------------------------------------------------------------
        failovers = []
        for mode in s.cluster_failover:
            if len(cluster.members) < 2:
                break
            result = _failover(cluster, mode, recovery_timeout=s.cluster_recovery_timeout_s)
            log(
                f"   failover ({result['mode']}): new master after {result['elected_s']} s, command applied after "
                f"{result['command_applied_s']} s, first token after {result['first_token_s']} s"
            )
            failovers.append(result)
            section.row(f"failover {result['mode']} -> new master", result["elected_s"], "s")
            section.row(
                f"failover {result['mode']} -> command applied",
                result["command_applied_s"],
                "s",
                goal=None if result["command_applied_s"] is not None else "FAILED",
            )
            section.row(
                f"failover {result['mode']} -> first token (re-placed)",
                result["first_token_s"],
                "s",
                goal=None if result["first_token_s"] is not None else "FAILED",
            )
        section.results["failover"] = failovers
        phase("failover measured")
    finally:
        for node in list(cluster.members):
            cluster.leave(node)
        phase("members stopped")
