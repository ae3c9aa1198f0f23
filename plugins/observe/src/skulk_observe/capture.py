"""`POST /v1/diagnostics/node/capture`: everything about this node worth attaching to a bug report.

One tar.gz: versions, the flight recorder, the node diagnostics, the process tree (the node and
its runner subprocesses with memory, CPU and state), the recent log lines, the local timeline,
State, and the node process's thread stacks. Built in memory (all parts are bounded).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import time
import traceback
from typing import Any

from skulk_kernel.api import NodeSurface

from . import OBSERVER
from .diagnostics import local_diag, local_timeline, plugin_versions, stalled_runners


def process_tree(root_pid: int | None = None) -> list[dict[str, Any]]:
    import psutil

    try:
        root = psutil.Process(root_pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    out = []
    for p in procs:
        try:
            with p.oneshot():
                mem = p.memory_info()
                out.append(
                    {
                        "pid": p.pid,
                        "ppid": p.ppid(),
                        "name": p.name(),
                        "cmdline": p.cmdline()[:12],
                        "status": p.status(),
                        "rssBytes": mem.rss,
                        "vmsBytes": mem.vms,
                        "cpuTimes": p.cpu_times()._asdict(),
                        "threads": p.num_threads(),
                        "createTime": p.create_time(),
                    }
                )
        except psutil.Error as exc:
            out.append({"pid": p.pid, "error": type(exc).__name__})
    return out


def thread_stacks() -> str:
    import threading

    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, '?')} ({ident})\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)


def _json(data: Any) -> bytes:
    return json.dumps(data, indent=2, default=str).encode()


def build_bundle(node: NodeSurface) -> tuple[str, bytes]:
    """(file name, tar.gz bytes) of this node's capture bundle."""
    observer = node.services.get(OBSERVER)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = f"skulk-capture-{node.node_id[:8]}-{stamp}"
    files: dict[str, bytes] = {
        "versions.json": _json({"runtime": node.runtime_info(), "distributions": plugin_versions()}),
        "recorder.json": _json(
            {
                "flightRecorder": observer.recorder.snapshot() if observer else [],
                "stalledRunners": stalled_runners(node),
            }
        ),
        "diagnostics.json": _json(local_diag(node)),
        "processes.json": _json(process_tree()),
        "logs.txt": ("\n".join(observer.logs.lines) + "\n" if observer else "").encode(),
        "timeline.json": _json(local_timeline(node, 0.0)),
        "state.json": _json(node.state.wire()),
        "threads.txt": thread_stacks().encode(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size = len(data)
            info.mtime = int(time.time())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return base + ".tar.gz", buf.getvalue()
