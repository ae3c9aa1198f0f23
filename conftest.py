"""How the whole suite runs in parallel (pytest-xdist), and where its time goes.

`./skulk test` runs the suite on several xdist workers (``-n``, ``--dist loadgroup``); this file
supplies the scheduler and the time report. The controller does not collect, so everything it
decides comes from a test's node id and its module's file:

* **Work units**: a test module is one unit (its module-scoped nodes start once per run); ``GROUPS``
  names modules that must share one (they must not run beside each other). A module
  whose source uses one of ``SHARED_NODES`` (session fixtures that start a node: the serving suites'
  llama.cpp node, the adapter suites' echo node) joins that fixture's group: one unit, one worker,
  one node for the run. Modules in ``SPLIT_BY_TEST`` (each test starts its own cluster, nothing is
  module-scoped) are split into one unit per test.
* **Longest first**: units go out in the order of their recorded duration (``tests/durations.json``;
  refresh it with ``SKULK_TEST_DURATIONS=tests/durations.json ./skulk test``), longest first, and a
  worker is given a new unit only when it is nearly done, so a long unit never waits in a busy
  worker's backlog while another worker idles. Units with no record go by their test count.
* **Real models two at a time**: units of ``MODEL_SUITES`` load real models and keep a core busy
  each; units of ``TIMING_SUITES`` assert how fast something happens and take every core. Units
  take ``cores_of(unit)`` of the ``CORES`` while they run; the other workers take light units
  meanwhile, and the timing units go first, before the model suites load the machine. Four model
  suites at once starved each other here (an MLX rank group missed its 120 s formation deadline),
  and a loop-stall bound or a stop with a frozen peer missed its bound beside a model suite.
* **Threads that sleep**: the OpenMP engines (llama.cpp's wheels and builds; torch under vLLM) wait
  at each of the many barriers of a token by spinning; beside other suites on two cores a spinning
  thread holds the core its partner needs (twenty streams on one llama.cpp server: 29 s beside three
  busy processes, 12 s with ``OMP_WAIT_POLICY=PASSIVE``, 3.4 s quiet either way), so the suite sets
  it for every process it starts unless the caller set it.
* **Time report**: at the end, the time per folder (setup + call + teardown, summed over workers)
  and the slowest units, so a closing note can say where CI time goes.

Clusters started by different workers never join each other: skulk_testing gives each test process
a cluster secret of its own (skulk_testing.isolation). (xdist's own ``xdist_group`` marks do not
reach the controller with pytest 9.2, which no longer reads the node id xdist rewrites; hence the
file-based grouping.)
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent
DURATIONS = ROOT / "tests" / "durations.json"
ENV_WRITE_DURATIONS = "SKULK_TEST_DURATIONS"
SLOW_UNITS_SHOWN = 10

#: session fixtures that start a node or an engine server -> the unit of every module using one
SHARED_NODES = {
    "llama_node": "@llama-node",
    "qwen_node": "@qwen-node",  # tests/conftest.py: Qwen2.5-Coder (tool round trips, fill-in-the-middle)
    "shared_echo_node": "@echo-node",
    "chat_server": "@llama-server",  # engine-llamacpp's session servers
    "embed_server": "@llama-server",
    "inproc": "@llama-server",
}
#: modules that must not run beside each other -> their shared unit (test_vllm_node counts every vLLM
#: server of the models folder in the process table, test_vllm_engine starts one)
GROUPS = {
    "plugins/engine-vllm/tests/test_vllm_engine.py": "@vllm",
    "plugins/engine-vllm/tests/test_vllm_node.py": "@vllm",
    # transformers caches whether torch exists when first imported: the diffusers engine's in-process
    # tests (torch from its own environment, put on the path) must run before anything in the same
    # process imports mlx-vlm (which imports transformers without torch); one unit keeps that order
    "plugins/engine-diffusers/tests/test_session.py": "@transformers",
    "plugins/engine-mlx/tests/test_vlm.py": "@transformers",
    "tests/vision/test_vision_mlx.py": "@transformers",
}
#: modules whose every test starts its own nodes (function-scoped fixtures only)
SPLIT_BY_TEST = ("tests/cluster/test_cluster.py",)
#: units that load real models (path prefixes or group names)
MODEL_SUITES = (
    "@llama-node",
    "@llama-server",
    "plugins/engine-mlx/tests/test_multirank.py",
    "@vllm",
    "plugins/engine-llamacpp/tests/test_speculative.py",
    "plugins/engine-llamacpp/tests/test_constrained_real.py",
    "tests/split/",
    "tests/media/images/",
    "tests/resume/",
    "tests/batch/",  # two SmolLM2 replicas on worker nodes
    "@qwen-node",
    "tests/steward/test_steward_qwen.py",
    "tests/serving/test_on_demand_node.py",  # Qwen placed on demand, twice
    "tests/hosts/test_lan.py",  # three llama.cpp nodes in namespaces, a model placed twice, Chromium
    "tests/speech/test_voice_loop.py",  # SmolLM2, Piper and Whisper on one node
)
#: units that assert how fast something happens (a kill noticed, a loop stall, a resume mid-stream):
#: they run with no model or other timing unit beside them, first, before the model suites start
TIMING_SUITES = (
    "tests/resume/",
    "plugins/transport-zenoh/tests/test_zenoh_processes.py",
    "plugins/transport-libp2p/tests/test_libp2p_processes.py",
    "tests/speech/test_voice_loop.py",  # a barge-in cancels the answer within 300 ms
)
CORES = 2  # the CI machine's: model units take one each, a timing unit takes all
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see "Threads that sleep" above


@functools.cache
def _shared_node_unit(path: str) -> str | None:
    try:
        text = (ROOT / path).read_text(errors="replace")
    except OSError:
        return None
    return next((unit for fixture, unit in SHARED_NODES.items() if re.search(rf"\b{fixture}\b", text)), None)


def unit_of(nodeid: str) -> str:
    """The work unit of a test (see the module docstring)."""
    path = nodeid.partition("::")[0]
    if path in SPLIT_BY_TEST:
        return nodeid
    return GROUPS.get(path) or _shared_node_unit(path) or path


def is_timing_unit(unit: str) -> bool:
    return unit.startswith(TIMING_SUITES)


def cores_of(unit: str) -> int:
    """Cores a unit takes while it runs: a timing unit all of them, a model unit one, others none."""
    return CORES if is_timing_unit(unit) else 1 if unit.startswith(MODEL_SUITES) else 0


def folder_of(nodeid: str) -> str:
    """The folder a test's time is reported under: `plugins/<name>`, `tests/<area>`, `kernel`, `testing`."""
    parts = nodeid.partition("::")[0].split("/")
    if parts[0] in ("plugins", "tests") and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def _recorded_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    recorded = _recorded_durations()

    class LongestFirst(LoadScopeScheduling):  # type: ignore[misc]
        """LoadScope over `unit_of`: longest unit first, one unit of backlog, model units capped."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def schedule(self) -> None:
            self._initial = True
            try:
                super().schedule()
            finally:
                self._initial = False

        def _cores_taken(self) -> int:
            work = (units.items() for units in self.assigned_work.values())
            return sum(cores_of(unit) for items in work for unit, tests in items if not all(tests.values()))

        def _assign_work_unit(self, node: Any) -> None:
            if not getattr(self, "_ordered", False):  # the queue is complete before the first unit goes
                units = sorted(
                    self.workqueue.items(),
                    key=lambda kv: (not is_timing_unit(kv[0]), -recorded.get(kv[0], float(len(kv[1]))), kv[0]),
                )
                self.workqueue.clear()
                self.workqueue.update(units)
                self._ordered = True
                if os.environ.get("SKULK_TEST_SHOW_UNITS"):
                    for unit, tests in self.workqueue.items():
                        print(f"unit {unit}: {len(tests)} tests, {recorded.get(unit, '?')} s", file=sys.stderr)
            taken = self._cores_taken()
            if taken + cores_of(next(iter(self.workqueue))) > CORES:
                fits = next((u for u in self.workqueue if taken + cores_of(u) <= CORES), None)
                if fits is not None:  # else the head goes anyway: never leave a worker with nothing
                    self.workqueue.move_to_end(fits, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            # the stock scheduler gives every worker two units at once; one is enough unless it holds
            # fewer than two tests (a worker runs a test only once it knows the next one)
            if getattr(self, "_initial", False) and self._pending_of(self.assigned_work.get(node, {})) >= 2:
                return
            super()._reschedule(node)

    return LongestFirst(config, log)


class _TimeReport:
    """Sums every test's setup + call + teardown time by unit, on the controller (or alone)."""

    def __init__(self) -> None:
        self.by_unit: dict[str, float] = defaultdict(float)
        self.by_folder: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.by_unit[unit_of(report.nodeid)] += report.duration
        self.by_folder[folder_of(report.nodeid)] += report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.by_unit:
            return
        write = terminalreporter.write_line
        terminalreporter.section("time per folder (setup + call + teardown, all workers)")
        total = sum(self.by_folder.values())
        for folder, seconds in sorted(self.by_folder.items(), key=lambda kv: -kv[1]):
            write(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {folder}")
        write(f"{total:8.1f}s  total")
        terminalreporter.section(f"slowest {SLOW_UNITS_SHOWN} work units")
        for unit, seconds in sorted(self.by_unit.items(), key=lambda kv: -kv[1])[:SLOW_UNITS_SHOWN]:
            write(f"{seconds:8.1f}s  {unit}")
        if out := os.environ.get(ENV_WRITE_DURATIONS):
            merged = {**_recorded_durations(), **{u: round(s, 1) for u, s in self.by_unit.items()}}
            Path(out).write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
            write(f"unit durations written to {out}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(_TimeReport(), "skulk-time-report")
