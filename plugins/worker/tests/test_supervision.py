"""Runner supervision with real runner subprocesses and real kills (echo engine, real node)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


def chat(node, content: str, stream: bool = False, timeout: float = 30) -> httpx.Response:
    body = {"model": "skulk/echo", "messages": [{"role": "user", "content": content}], "stream": stream}
    return httpx.post(node.url + "/v1/chat/completions", json=body, timeout=timeout)


def runner_pids(node) -> list[int]:
    diag = node.get("/v1/diagnostics/node").json()
    return [r["pid"] for r in diag["supervisorRunners"] if r["pid"]]


def test_kill_9_mid_stream_ends_stream_with_error_then_recovers(node_factory, echo_profile):
    node = node_factory(echo_profile()).wait_api().wait_ready("skulk/echo")
    (pid,) = runner_pids(node)
    lines: list[str] = []
    started = time.monotonic()
    words = " ".join(f"w{i}" for i in range(200))
    with httpx.stream(
        "POST",
        node.url + "/v1/chat/completions",
        timeout=30,
        json={"model": "skulk/echo", "stream": True, "messages": [{"role": "user", "content": f"/slow {words}"}]},
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if len(lines) == 8:
                os.kill(pid, signal.SIGKILL)
    elapsed = time.monotonic() - started
    errors = [json.loads(line[6:]) for line in lines if line.startswith("data: {") and '"error"' in line]
    assert errors, f"stream ended without an error event: {lines[-5:]}"
    assert "exited unexpectedly" in errors[0]["error"]["message"]
    assert elapsed < 10
    node.wait_ready("skulk/echo", timeout=30)
    assert runner_pids(node) and runner_pids(node)[0] != pid
    answer = chat(node, "back again")
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "back again"


def test_crash_loop_fails_instance_with_reason(node_factory, echo_profile):
    node = node_factory(echo_profile(max_restarts=1)).wait_api().wait_ready("skulk/echo")
    instance_id = node.ready_instances("skulk/echo")[0]
    for _ in range(2):
        node.wait_ready("skulk/echo", timeout=30)
        response = chat(node, "/crash")
        assert response.status_code in (200, 500, 502, 503)  # the request itself fails, never hangs

    def failed() -> bool:
        state = node.state()
        return instance_id not in state["instances"] and any(
            f["instanceId"] == instance_id for f in state["instanceFailures"]
        )

    node.wait_until(failed, 30, "the instance to be failed")
    reason = next(f["reason"] for f in node.state()["instanceFailures"] if f["instanceId"] == instance_id)
    assert "gave up after 2 crashes" in reason


def test_runner_processes_are_reaped_on_shutdown(node_factory, echo_profile):
    node = node_factory(echo_profile()).wait_api().wait_ready("skulk/echo")
    pids = runner_pids(node)
    assert pids
    os.kill(node.pid(), signal.SIGTERM)  # the node alone, not its process group
    node.proc.wait(20)
    for pid in pids:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"runner {pid} outlived its node")


def test_concurrent_requests_all_complete(node_factory, echo_profile):
    node = node_factory(echo_profile()).wait_api().wait_ready("skulk/echo")
    results: dict[int, str] = {}

    def one(i: int) -> None:
        response = chat(node, f"request number {i}")
        results[i] = response.json()["choices"][0]["message"]["content"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: f"request number {i}" for i in range(12)}


def test_runners_die_with_a_node_killed_outright(node_factory, echo_profile):
    """kill -9 of the node process alone: its runner must not linger as an orphan."""
    node = node_factory(echo_profile()).wait_api().wait_ready("skulk/echo")
    pids = runner_pids(node)
    os.kill(node.pid(), signal.SIGKILL)
    node.proc.wait(10)
    deadline = time.monotonic() + 10
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    assert not alive, f"orphaned runners {alive}"
