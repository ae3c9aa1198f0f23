"""Node-side: reap orphaned vLLM servers at start, and turn a server's unexpected death into a failed instance.

Why on the node and not in the runner: a runner can only report statuses and chunks, and a dead
server is not a crashed runner (restarting the runner in place would hide the cause). The runner's
:class:`~.managed.ManagedServer` writes an exit record with the reason; this loop reads it and
submits ``FailInstance(replace=True)``, so the failure is recorded with its reason in State and
the master places the model again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from skulk_kernel.api import CommandId, FailInstance, InstanceId, NodeSurface, new_id

from .managed import read_exit_records, reap_orphans

log = logging.getLogger("skulk.engine_vllm.watch")
POLL_S = 0.5


def clean_start(run_dir: Path) -> int:
    """At node start: kill servers whose runner is gone, drop exit records of a previous life."""
    reaped = reap_orphans(run_dir)
    for path, _ in read_exit_records(run_dir):
        path.unlink(missing_ok=True)
    return len(reaped)


async def report_exits(node: NodeSurface, run_dir: Path) -> int:
    """Submit a FailInstance for every exit record whose instance still exists; returns how many."""
    sent = 0
    for path, record in read_exit_records(run_dir):
        path.unlink(missing_ok=True)
        instance_id = record.labels.get("instance_id", "")
        if InstanceId(instance_id) not in node.state.instances:
            continue
        log.error("instance %s failed: %s", instance_id, record.reason)
        node.spawn(
            node.submit(
                FailInstance(
                    command_id=CommandId(new_id()),
                    instance_id=InstanceId(instance_id),
                    reason=f"{record.reason}; placing {record.labels.get('model_id', 'the model')} again",
                    replace=True,
                )
            ),
            "submit",
        )
        sent += 1
    return sent


async def watch_loop(node: NodeSurface, run_dir: Path) -> None:
    while not node.stopping:
        try:
            await report_exits(node, run_dir)
        except Exception:
            log.exception("could not report a vLLM server exit")
        await asyncio.sleep(POLL_S)
