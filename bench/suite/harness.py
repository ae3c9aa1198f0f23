"""What the sections share: the settings of this run and the one serving node they reuse."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skulk_testing.nodes import NodeProcess

from . import nodes
from .common import log

#: Seconds of idle time between a node's last runner becoming ready and the first measurement.
SETTLE_S = 3.0

#: API adapters the serving node gets on top of the profile when they are installed.
EXTRA_API_PLUGINS = ("api-anthropic", "api-ollama")


def all_runners_ready(node: NodeProcess) -> bool:
    state = node.state()
    statuses = [next(iter(s)) for s in state["runners"].values()]
    return (
        bool(statuses)
        and all(s in ("RunnerReady", "RunnerRunning") for s in statuses)
        and len(statuses) >= len(state["instances"])
    )


@dataclass
class Settings:
    profile: str
    model: str
    models_dir: Path
    quick: bool
    skip_inprocess: bool
    # counts (filled from --quick / --tiny / the defaults)
    kernel_records: int
    kernel_repeats: int
    apply_events: int
    serving_pairs: int
    serving_max_tokens: int
    ttft_probes: int
    format_rounds: int
    concurrency_levels: list[int]
    concurrency_max_tokens: int
    concurrency_min_requests: int
    cold_starts: int
    measure_provisioning: bool
    cluster_tokens: int
    cluster_rounds: int
    cluster_commands: int
    cluster_log_targets: list[int]
    cluster_failover: list[str]
    cluster_recovery_timeout_s: float
    startup_timeout_s: float = 300.0

    def as_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


@dataclass
class Bench:
    settings: Settings
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="skulk-bench-")))
    node: NodeProcess | None = None
    node_profile: dict[str, Any] = field(default_factory=dict)
    model_info: dict[str, Any] = field(default_factory=dict)
    node_start_s: float | None = None

    network_version: str = field(default_factory=lambda: f"bench-{os.getpid()}-{int(time.time())}")

    def __post_init__(self) -> None:
        nodes.SCRATCH[:] = [self.scratch]  # every node home, profile and models copy lives under it

    def env(self, models_dir: Path | None = None, isolate: str = "") -> dict[str, str]:
        """The environment of a bench node. A network version of this run's own keeps profiles that
        join the LAN cluster (zenoh with multicast scouting) from joining any other cluster on the
        host (tests, other runs); `isolate` gives one node a version of its own."""
        return {
            "SKULK_MODELS_DIR": str(models_dir or self.settings.models_dir),
            "HF_HUB_OFFLINE": "1",
            "SKULK_NETWORK_VERSION": f"{self.network_version}{'-' + isolate if isolate else ''}",
        }

    def serving_node(self) -> NodeProcess:
        """The node the serving and concurrency sections measure: the profile plus the installed API
        adapters (so every wire format can be compared), the model placed by the profile's defaults."""
        if self.node is not None and nodes.alive(self.node):
            return self.node
        installed = nodes.installed_plugins()
        extra = [p for p in EXTRA_API_PLUGINS if p in installed]
        path, summary = nodes.derived_profile(self.settings.profile, extra, self.scratch / "serving-profile.toml")
        self.node_profile = summary
        log(f"   starting a node: profile {summary['base']} + {summary['extra_plugins'] or 'nothing'}")
        started = time.perf_counter()
        node = nodes.start(str(path), home=self.scratch / "serving-home", env=self.env())
        self.node = node
        node.wait_api(timeout=self.settings.startup_timeout_s)
        node.wait_ready(self.settings.model, timeout=self.settings.startup_timeout_s)
        self.node_start_s = time.perf_counter() - started
        # measure a settled node: every default model loaded (not just ours), start-up bursts over
        nodes.wait_for(lambda: all_runners_ready(node), self.settings.startup_timeout_s, "every runner ready", 0.2)
        time.sleep(SETTLE_S)
        self.model_info = self.describe_model(node)
        return node

    def describe_model(self, node: NodeProcess) -> dict[str, Any]:
        info: dict[str, Any] = {"id": self.settings.model}
        try:
            listing = node.get("/models", timeout=10).json()
            for entry in listing.get("data", []):
                if self.settings.model in (entry.get("id"), entry.get("model_id"), entry.get("name")):
                    info.update(
                        {
                            "id": entry.get("id"),
                            "quantization": entry.get("quantization"),
                            "family": entry.get("family"),
                            "storage_size": entry.get("storage_size"),
                            "context_length": entry.get("context_length"),
                        }
                    )
                    break
        except Exception as exc:  # the listing is informative only
            info["error"] = str(exc)
        path = self.model_file()
        if path is not None:
            info["file"] = str(path)
            info["file_bytes"] = path.stat().st_size
        return info

    def model_file(self) -> Path | None:
        try:
            from skulk_store.store import LocalModelStore
        except ImportError:
            return None
        try:
            return LocalModelStore(self.settings.models_dir).local_path(self.settings.model)
        except Exception:
            return None

    def close(self) -> None:
        nodes.stop_all()
        if os.environ.get("SKULK_BENCH_KEEP_SCRATCH") != "1":
            shutil.rmtree(self.scratch, ignore_errors=True)
