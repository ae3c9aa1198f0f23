"""Section 1, kernel: event-log append/replay vs raw msgpack; apply() vs msgpack decode.

The logic is the two standalone scripts' (``bench/bench_eventlog.py``, ``bench/bench_apply.py``),
called as functions in this process; their baselines are measured in the same call.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import ROOT, Section

BENCH = ROOT / "bench"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"skulk_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run(section: Section, *, records: int, repeats: int, events: int) -> None:
    eventlog = _load("bench_eventlog").run(records=records, repeats=repeats, parent=Path(tempfile.gettempdir()))
    apply = _load("bench_apply").run(events=events)
    section.context = {
        "records": records,
        "repeats": repeats,
        "apply_events": events,
        "note": "best-of-repeats timings; the baselines are raw msgpack in memory",
    }
    section.results = {"eventlog": eventlog, "apply": apply}

    base = eventlog["baseline"]
    default = eventlog["eventlog"]["default(fsync_every=1000,rotate=64MiB)"]
    section.add_ratio(
        "eventlog_append_vs_msgpack", default["append_vs_baseline"], "msgpack packb into a BytesIO (records/s)"
    )
    section.add_ratio(
        "eventlog_replay_vs_msgpack", default["replay_vs_baseline"], "msgpack unpackb out of a BytesIO (records/s)"
    )
    section.add_ratio(
        "apply_vs_msgpack_decode",
        apply["ratio_decode_validate_apply_vs_baseline"],
        "msgpack decode of the same events (events/s)",
        note="decode + pydantic validation + apply()",
    )
    section.add_ratio(
        "apply_only_vs_msgpack_decode",
        apply["ratio_apply_only_vs_baseline"],
        "msgpack decode of the same events (events/s)",
        note="apply() on pre-validated events",
    )
    section.row(
        "event-log append (fsync/1000)",
        default["append_rec_s"],
        "rec/s",
        baseline=base["append_rec_s"],
        ratio=default["append_vs_baseline"],
    )
    section.row(
        "event-log replay",
        default["replay_rec_s"],
        "rec/s",
        baseline=base["replay_rec_s"],
        ratio=default["replay_vs_baseline"],
    )
    section.row(
        "decode+validate+apply()",
        apply["decode_validate_apply_per_s"],
        "ev/s",
        baseline=apply["baseline_msgpack_decode_per_s"],
        ratio=apply["ratio_decode_validate_apply_vs_baseline"],
    )
    section.row(
        "apply() only",
        apply["apply_only_per_s"],
        "ev/s",
        baseline=apply["baseline_msgpack_decode_per_s"],
        ratio=apply["ratio_apply_only_vs_baseline"],
    )
