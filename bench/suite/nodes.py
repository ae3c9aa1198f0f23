"""Real node processes for the benchmarks (skulk_testing's NodeProcess), every one stopped for sure.

Each node gets its own home and API port; every node this process starts is registered, and
:func:`stop_all` (called from the runner's ``finally`` and its signal handlers) stops whatever is
still running, runners included (the node's whole process group).

One difference from the test fixture: a bench node gets its own process *group* but stays in the
bench's *session*. Linux's autogroup scheduler (``kernel.sched_autogroup_enabled``) shares the CPU
per session first; a node in a session of its own would get a share of its own on a loaded box,
while the in-process baseline (engine and client in the bench process) would get one share for
both, and the node would look faster than the engine it wraps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from skulk_testing.nodes import NodeProcess, free_port

STARTED: list[NodeProcess] = []
SCRATCH: list[Path] = []  # the run's scratch folder (set by the Bench; removed when it closes)


def scratch_dir(prefix: str) -> Path:
    parent = SCRATCH[0] if SCRATCH else Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=parent))


class BenchNode(NodeProcess):
    def start(self) -> BenchNode:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path = self.home / "node.log"
        env = {**os.environ, "SKULK_HOME": str(self.home), "HF_HUB_OFFLINE": "1", **self.env}
        cmd = [
            sys.executable,
            "-m",
            "skulk_kernel.cli",
            "run",
            "--profile",
            self.profile,
            "--api-port",
            str(self.api_port),
            "--api-host",
            "127.0.0.1",
            *self.args,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        return self


def start(
    profile: str, *args: str, home: Path, env: dict[str, str] | None = None, api_port: int | None = None
) -> NodeProcess:
    node = BenchNode(profile=profile, home=home, api_port=api_port or free_port(), args=args, env=env or {})
    STARTED.append(node)
    return node.start()


def stop_all() -> None:
    for node in reversed(STARTED):
        try:
            node.stop(timeout=10)
        except Exception:
            pass


def started_pids() -> list[int]:
    return [n.proc.pid for n in STARTED if n.proc is not None]


def alive(node: NodeProcess) -> bool:
    return node.proc is not None and node.proc.poll() is None


# -- profiles -------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def profile_toml(
    name: str,
    plugins: list[str],
    planes: dict[str, str | None],
    config: dict[str, dict[str, Any]],
    description: str = "",
) -> str:
    lines = ["[profile]", f"name = {_toml_value(name)}"]
    if description:
        lines.append(f"description = {_toml_value(description)}")
    lines += [f"plugins = {_toml_value(plugins)}", "", "[planes]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in planes.items() if v]
    for plugin, table in config.items():
        lines += ["", f"[plugins.{plugin}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"


def derived_profile(
    base: str, extra_plugins: list[str], path: Path, default_models: list[str] | None = None
) -> tuple[Path, dict[str, Any]]:
    """`base` (bundled name or path) plus `extra_plugins`, written to `path`. Returns (path, summary)."""
    from skulk_kernel.profiles import load_profile

    prof = load_profile(base)
    added = [p for p in extra_plugins if p not in prof.plugins]
    plugins = list(prof.plugins) + added
    config = {k: dict(v) for k, v in prof.plugin_config.items()}
    if default_models is not None:
        config.setdefault("master", {})["default_models"] = default_models
    planes = {"control": prof.planes.control, "telemetry": prof.planes.telemetry, "data": prof.planes.data}
    text = profile_toml(
        f"bench-{prof.name}",
        plugins,
        planes,
        config,
        f"{prof.name} plus {', '.join(added) or 'nothing'} (written by bench/run.py)",
    )
    path.write_text(text)
    return path, {
        "base": prof.name,
        "source": prof.source,
        "plugins": plugins,
        "planes": planes,
        "config": config,
        "extra_plugins": added,
        "path": str(path),
    }


def installed_plugins() -> dict[str, str]:
    """`skulk-kernel plugins`, parsed: entry-point name -> distribution + version."""
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "plugins"], capture_output=True, text=True, timeout=60
    ).stdout
    found = {}
    for line in out.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3:
            found[parts[0]] = f"{parts[1]} {parts[2]}"
    return found


# -- placement helpers ----------------------------------------------------------------------------


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}" + (f" ({last_exc})" if last_exc else ""))


def instances_of(node: NodeProcess, model_id: str) -> dict[str, dict[str, Any]]:
    out = {}
    for wrapped in node.state()["instances"].values():
        inst = next(iter(wrapped.values()))
        if inst["shardAssignments"]["modelId"] == model_id:
            out[inst["instanceId"]] = inst
    return out


def instance_backend(inst: dict[str, Any]) -> str:
    shard = next(iter(inst["shardAssignments"]["runnerToShard"].values()))
    return str(next(iter(shard.values()))["backend"])


def _with_backend(obj: Any, backend: str) -> Any:
    if isinstance(obj, dict):
        return {k: (backend if k == "backend" else _with_backend(v, backend)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_with_backend(v, backend) for v in obj]
    return obj


def node_backends(node: NodeProcess) -> list[str]:
    resources = node.state().get("nodeResources") or {}
    backends: list[str] = []
    for entry in resources.values():
        backends += [b for b in entry.get("backends") or () if b not in backends]
    return backends


def move_to_backend(node: NodeProcess, model_id: str, backend: str, timeout: float = 180) -> str:
    """Place a copy of `model_id` on `backend` (the planner's choice with the backend rewritten, sent as
    POST /instance), wait until it is ready, then delete every other instance of the model."""
    current = instances_of(node, model_id)
    for iid, inst in current.items():
        if instance_backend(inst) == backend and iid in node.ready_instances(model_id):
            for other in current:
                if other != iid:
                    httpx.delete(f"{node.url}/instance/{other}", timeout=30)
            return iid
    planned = node.get("/instance/placement", params={"model_id": model_id}, timeout=30)
    planned.raise_for_status()
    wrapped = _with_backend(planned.json()["instance"], backend)
    kind = next(iter(wrapped))
    wrapped[kind]["engine"] = backend.split("-", 1)[0]
    created = node.post("/instance", json={"instance": wrapped}, timeout=30)
    created.raise_for_status()
    iid = created.json()["instance_id"]
    wait_for(lambda: iid in node.ready_instances(model_id), timeout, f"{model_id} on {backend}", 0.2)
    for other in current:
        deleted = httpx.delete(f"{node.url}/instance/{other}", timeout=30)
        deleted.raise_for_status()
    return iid


def link_or_copy_tree(src: Path, dst: Path) -> None:
    """Hard-link files when possible (same filesystem), else copy."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.hardlink_to(path)
        except OSError:
            shutil.copy2(path, target)
