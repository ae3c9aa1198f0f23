"""Placing a model on a test node, robustly."""

from __future__ import annotations

import time

from skulk_testing.nodes import NodeProcess


def place_until_listed(node: NodeProcess, model_id: str, timeout: float = 120) -> None:
    """Place ``model_id`` and wait for its instance in State, placing again if it never shows.

    A placement answered 200 just after the node's first resource report was seen to vanish
    (no instance, no failure) on a loaded box; the test is about tools, not that race.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = node.post("/place_instance", json={"model_id": model_id})
        if r.status_code == 200:
            instance: str = r.json()["instance_id"]

            def listed(i: str = instance) -> bool:
                return i in node.state()["instances"]

            try:
                node.wait_until(listed, 20, f"instance {instance}")
                return
            except TimeoutError:
                continue
        time.sleep(1)  # 503 info_gossiping until the node has reported its resources
    raise TimeoutError(f"{model_id} was never placed")
