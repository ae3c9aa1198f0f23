"""A peer copy of one large file in a process of its own (`python -m skulk_store.copyproc`).

Why: a node copying a model is also serving. Its event loop, the API's streams and the plugins'
threads hold the GIL in turn, and every read and write of the copy has to take it back (waiting up
to the 5 ms switch interval each time), so an in-process copy runs at the speed of the node's
busiest thread rather than the wire's. The child runs `rangecopy.FileCopy` alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from .rangecopy import CopyResult, FileCopy, RangeSource

log = logging.getLogger("skulk.store.copyproc")

#: files at least this large are copied by a child process (`copy_in_child`); smaller ones in-thread
CHILD_FROM_BYTES = 64 << 20


def copy_in_child(copy: FileCopy) -> CopyResult:
    """Run `copy` in a child process; the same result as `copy.run()`, the sources updated.

    The job, tokens included, goes on the child's stdin (never its argv, which `ps` shows);
    progress and the result come back as JSON lines on its stdout. The child exits when its stdin
    closes, so a node that dies or gives up takes its copy with it; the resume record it leaves
    behind is the same as in-thread.
    """
    job = {
        "part": str(copy.part),
        "size": copy.size,
        "sha256": copy.sha256,
        "range_bytes": copy.range_bytes,
        "in_flight": copy.in_flight,
        "sources": [
            {"node_id": s.node_id, "host": s.host, "port": s.port, "target": s.target, "token": s.token}
            for s in copy.sources
            if not s.broken
        ],
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "skulk_store.copyproc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    result: CopyResult | None = None
    try:
        proc.stdin.write(json.dumps(job).encode() + b"\n")
        proc.stdin.flush()
        for line in proc.stdout:
            message = json.loads(line)
            if "done" in message:
                copy.done_bytes = int(message["done"])
                copy.on_progress(copy.done_bytes)
            elif "result" in message:
                r = message["result"]
                result = CopyResult(r["status"], r["digest"], r["resumed_bytes"], r["received"], r["raced"])
                by_id = {s.node_id: s for s in copy.sources}
                for node_id, state in r["sources"].items():
                    src = by_id[node_id]
                    src.received, src.failures = state["received"], state["failures"]
                    src.broken, src.last_error = state["broken"], state["last_error"]
                break
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if result is None:
        log.warning("the copy process for %s ended without a result (exit %s)", copy.part.name, proc.returncode)
        return CopyResult("incomplete", received={s.node_id: s.received for s in copy.sources})
    return result


def _child() -> None:
    job = json.loads(sys.stdin.readline())

    def orphaned() -> None:  # the parent closed stdin (it died, or gave up): stop at once
        sys.stdin.read()
        os._exit(3)

    threading.Thread(target=orphaned, daemon=True).start()
    out = sys.stdout
    lock = threading.Lock()

    def say(message: dict[str, object]) -> None:
        with lock:
            out.write(json.dumps(message) + "\n")
            out.flush()

    sources = [RangeSource(**s) for s in job["sources"]]
    copy = FileCopy(
        Path(job["part"]),
        int(job["size"]),
        str(job["sha256"]),
        sources,
        lambda done: say({"done": done}),
        int(job["range_bytes"]),
        int(job["in_flight"]),
    )
    r = copy.run()
    say(
        {
            "result": {
                "status": r.status,
                "digest": r.digest,
                "resumed_bytes": r.resumed_bytes,
                "received": r.received,
                "raced": r.raced,
                "sources": {
                    s.node_id: {
                        "received": s.received,
                        "failures": s.failures,
                        "broken": s.broken,
                        "last_error": s.last_error,
                    }
                    for s in sources
                },
            }
        }
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _child()
