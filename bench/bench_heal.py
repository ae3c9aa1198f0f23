"""Healing after a node's death, as a ratio measured in one run ([scale], acceptance 4).

    .venv/bin/python bench/bench_heal.py [--rounds 2] [--out bench/results/heal.json]

Three real node processes on loopback, SmolLM2-135M on llama.cpp (1 thread), the control plane on
Zenoh and on libp2p. The model's only instance is pinned to one node (on Zenoh a worker, on libp2p
the master, so a survivor is elected before it heals), a third node joins that can take it over,
and the pinned node gets SIGKILL. A client asks the surviving API node for four tokens every
0.25 s until the model answers again.

Per round and control plane: the instance's load time (placement to ready: what a healed model
must pay again on its new node), the time from the kill to the new instance's placement in State,
and to the first answer. The baseline, in the same run, is the same cluster with
`departed_after_s` raised to `node_timeout_s` (30 s): a master that waits for a dead node's
silence to reach the prune timeout before re-placing, as every node death cost before [scale].
The acceptance reads `heal - load` against 8 s; `tests/cluster/test_healing.py` checks the same
with the echo engine in the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster.conftest import PROFILES, Cluster, instance_nodes, lone_instance  # noqa: E402
from tests.conftest import CHAT_MODEL, MODELS_DIR  # noqa: E402

NODE_TIMEOUT_S = 30.0


def _profile(path: Path, control: str, departed_after_s: float) -> Path:
    timeout = f"node_timeout_s = {NODE_TIMEOUT_S}"
    text = (
        PROFILES[control]
        .format(default_models="[]", timeout=NODE_TIMEOUT_S, multicast="true", engine="engine-llamacpp")
        .replace(timeout, f"{timeout}\ndeparted_after_s = {departed_after_s}")
    )
    path.write_text(text + "\n[plugins.engine-llamacpp]\nn_threads = 1\nn_threads_batch = 1\n")
    return path


def _answers(api: Any) -> bool:
    body = {"model": CHAT_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        return httpx.post(api.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def one_round(tmp: Path, control: str, departed_after_s: float) -> dict[str, Any]:
    """One kill -9 of the lone instance's host: load, re-placement and answer times in seconds."""
    tmp.mkdir(parents=True, exist_ok=True)
    profile = _profile(tmp / "profile.toml", control, departed_after_s)
    cluster = Cluster(tmp, profile, f"h{uuid.uuid4().hex[:10]}", {"SKULK_MODELS_DIR": str(MODELS_DIR)}, control)
    try:
        host, host_id, api, instance_id, load_s = lone_instance(cluster, CHAT_MODEL, timeout=90)
        host.kill()
        killed = time.monotonic()
        replaced_s = answered_s = None
        while time.monotonic() - killed < NODE_TIMEOUT_S + 60:
            if replaced_s is None:
                try:
                    nodes = instance_nodes(api.state())
                except httpx.HTTPError:
                    nodes = {}
                if any(iid != instance_id and host_id not in on for iid, on in nodes.items()):
                    replaced_s = time.monotonic() - killed
            if _answers(api):
                answered_s = time.monotonic() - killed
                break
            time.sleep(0.25)
        if answered_s is None:
            raise TimeoutError(f"{control}: never served again in {NODE_TIMEOUT_S + 60:.0f}s")
        return {"load_s": load_s, "replaced_s": replaced_s, "heal_s": answered_s, "beyond_load_s": answered_s - load_s}
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--controls", default="zenoh,libp2p")
    parser.add_argument("--departed-after-s", type=float, default=3.0, help="the master's setting under test")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "heal.json")
    args = parser.parse_args()
    controls = args.controls.split(",")
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {c: {"heal": [], "baseline": []} for c in controls}
    with tempfile.TemporaryDirectory(prefix="bench-heal-") as scratch:
        for r in range(args.rounds):
            # the order flips each round, so a box growing busier does not favour one side
            modes = [("heal", args.departed_after_s), ("baseline", NODE_TIMEOUT_S)]
            for control in controls:
                for mode, departed in modes if r % 2 == 0 else modes[::-1]:
                    got = one_round(Path(scratch) / f"{control}-{mode}-{r}", control, departed)
                    rows[control][mode].append(got)
                    shown = ", ".join(f"{k} {v:.2f}" for k, v in got.items() if v is not None)
                    print(f"round {r} {control} {mode}: {shown}", flush=True)
    summary: dict[str, Any] = {}
    for control, modes in rows.items():
        heal = statistics.median(x["heal_s"] for x in modes["heal"])
        base = statistics.median(x["heal_s"] for x in modes["baseline"])
        summary[control] = {
            "heal_s": heal,
            "baseline_heal_s": base,
            "ratio": heal / base,
            "load_s": statistics.median(x["load_s"] for x in modes["heal"]),
            "beyond_load_s": statistics.median(x["beyond_load_s"] for x in modes["heal"]),
            "acceptance_beyond_load_under_8s": all(x["beyond_load_s"] < 8.0 for x in modes["heal"]),
        }
        print(
            f"{control}: served again {heal:.2f} s after kill -9 against {base:.2f} s waiting for the prune "
            f"timeout ({heal / base:.2f}x); {summary[control]['beyond_load_s']:.2f} s beyond the model's load "
            f"time ({summary[control]['load_s']:.2f} s)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"rounds": rows, "summary": summary, "load_average": list(os.getloadavg())}
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
