"""The steward on a three-node cluster with the Qwen 0.5B card: five questions, how many it gets
right (checked against /state), and the canary's latency. Run once: .venv/bin/python bench/bench_steward.py"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import MODELS_DIR
from tests.steward.test_steward_qwen import start_qwen_cluster, wait


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-steward-"))
    nodes = start_qwen_cluster(tmp, MODELS_DIR, 3)
    try:
        state = nodes[0].state()
        names = {nid: v["friendlyName"] for nid, v in state["nodeIdentities"].items()}
        master = names[state["masterNodeId"]]
        steward_node = names[nodes[0].get("/v1/steward").json()["nodeIds"][0]]
        questions = [
            ("How many nodes are in the cluster?", lambda a: re.search(r"\b(3|three)\b", a.lower())),
            ("Which node is the master?", lambda a: master in a),
            ("Are any user model instances placed?", lambda a: re.search(r"\b(no|none|not)\b", a.lower())),
            ("Which node runs the steward service?", lambda a: steward_node in a),
            (
                "Can the model Qwen/Qwen2.5-Coder-0.5B-Instruct be placed now?",
                lambda a: re.search(r"\b(yes|can|would)\b", a.lower()),
            ),
        ]
        right = 0
        for question, check in questions:
            began = time.monotonic()
            body = {"model": "skulk/steward", "messages": [{"role": "user", "content": question}]}
            answer = nodes[1].post("/v1/chat/completions", json=body, timeout=300).json()
            text = answer["choices"][0]["message"]["content"] or ""
            ok = bool(check(text))
            right += ok
            print(f"{'RIGHT' if ok else 'WRONG'} ({time.monotonic() - began:.1f}s) {question}\n    {text.strip()}")
        print(f"{right}/5 right (master {master}, steward on {steward_node})")
        canary = wait(lambda: nodes[0].get("/v1/steward").json()["canary"], 120, "a canary")
        print(f"canary: ok={canary['ok']} latency {canary['latencyS']} s")
    finally:
        for n in nodes:
            n.stop()


if __name__ == "__main__":
    main()
