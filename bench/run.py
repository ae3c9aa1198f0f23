"""Skulk's benchmark suite: one command, one JSON report, PNG plots, a short table.

    python bench/run.py [--quick] [--out bench/results]
    python bench/run.py --profile dev --model skulk/echo --skip-inprocess --tiny   # the harness on the echo engine

Sections (each self-contained; one that cannot run is recorded as skipped with the reason):

1. kernel       event-log append/replay vs raw msgpack; apply() vs msgpack decode
2. serving      the node's /v1/chat/completions vs the same engine in-process (decode tok/s ratio, TTFT
                overhead); /v1/messages, /v1/responses, /api/chat relative to chat completions
3. concurrency  aggregate tok/s and TTFT p50/p90 at 1..16 streams, llama_server-cpu vs llama_cpp-cpu
4. coldstart    `skulk-kernel run` -> first streamed token (and first-ever provisioning when cheap)
5. cluster      remote-API per-token overhead, command latency, join time vs log length, failover
                (only with transport-zenoh + election-bully installed)

The machine is shared and small: every section reports ratios against a baseline measured in the
same run, and the report records the machine, package versions and the model with every figure.
Full run: well under 20 minutes; --quick: under 3 minutes. See docs/benchmarks.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ensure_venv() -> None:
    """`python bench/run.py` from outside the venv: re-run under the checkout's .venv if it has Skulk."""
    try:
        import skulk_kernel  # noqa: F401
        import skulk_testing  # noqa: F401
    except ImportError:
        venv_python = ROOT / ".venv" / "bin" / "python"
        if (
            venv_python.exists()
            and Path(sys.prefix).resolve() != (ROOT / ".venv").resolve()
            and not os.environ.get("SKULK_BENCH_REEXEC")
        ):
            os.environ["SKULK_BENCH_REEXEC"] = "1"
            os.execv(str(venv_python), [str(venv_python), *sys.argv])
        sys.exit("bench/run.py needs Skulk installed: run ./skulk setup, then .venv/bin/python bench/run.py")


_ensure_venv()
sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from suite import cluster, coldstart, concurrency, kernel, nodes, plots, serving  # noqa: E402
from suite.common import (  # noqa: E402
    SCHEMA,
    Section,
    git_info,
    load_average,
    log,
    machine_info,
    package_versions,
    run_section,
    utc_now,
)
from suite.harness import Bench, Settings  # noqa: E402

SECTIONS = {
    "kernel": "event log and apply() vs raw msgpack",
    "serving": "node API vs the same engine in-process",
    "concurrency": "aggregate tok/s and TTFT vs concurrent streams, per backend",
    "coldstart": "skulk-kernel run -> first streamed token",
    "cluster": "remote API, command latency, join time, failover",
}
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def default_models_dir() -> Path:
    for var in ("SKULK_MODELS_DIR", "SKULK_TEST_MODELS_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(tempfile.gettempdir()) / "skulk-test-models"


def settings_from(args: argparse.Namespace) -> Settings:
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    presets: dict[str, dict[str, Any]] = {
        "full": dict(
            kernel_records=100_000,
            kernel_repeats=3,
            apply_events=30_000,
            serving_pairs=16,
            ttft_probes=40,
            serving_max_tokens=128,
            format_rounds=5,
            concurrency_levels=[1, 2, 4, 8, 16],
            concurrency_max_tokens=64,
            concurrency_min_requests=4,
            cold_starts=3,
            measure_provisioning=True,
            cluster_tokens=200,
            cluster_rounds=10,
            cluster_commands=200,
            cluster_log_targets=[1000, 4000],
            cluster_failover=["clean", "kill"],
            cluster_recovery_timeout_s=30.0,
        ),
        "quick": dict(
            kernel_records=20_000,
            kernel_repeats=1,
            apply_events=5_000,
            serving_pairs=4,
            ttft_probes=8,
            serving_max_tokens=64,
            format_rounds=2,
            concurrency_levels=[1, 4],
            concurrency_max_tokens=64,
            concurrency_min_requests=2,
            cold_starts=1,
            measure_provisioning=False,
            cluster_tokens=100,
            cluster_rounds=4,
            cluster_commands=50,
            cluster_log_targets=[300],
            cluster_failover=["kill"],
            cluster_recovery_timeout_s=10.0,
        ),
        "tiny": dict(
            kernel_records=2_000,
            kernel_repeats=1,
            apply_events=500,
            serving_pairs=2,
            ttft_probes=2,
            serving_max_tokens=16,
            format_rounds=1,
            concurrency_levels=[1, 2],
            concurrency_max_tokens=8,
            concurrency_min_requests=1,
            cold_starts=1,
            measure_provisioning=False,
            cluster_tokens=20,
            cluster_rounds=2,
            cluster_commands=10,
            cluster_log_targets=[],
            cluster_failover=["kill"],
            cluster_recovery_timeout_s=5.0,
        ),
    }
    counts: dict[str, Any] = presets[mode]
    if args.levels:
        counts["concurrency_levels"] = [int(x) for x in args.levels.split(",")]
    return Settings(
        profile=args.profile,
        model=args.model,
        models_dir=Path(args.models_dir),
        quick=mode != "full",
        skip_inprocess=args.skip_inprocess,
        startup_timeout_s=args.startup_timeout,
        **counts,
    )


def model_block(bench: Bench) -> dict[str, Any]:
    if bench.model_info:
        return bench.model_info
    info: dict[str, Any] = {"id": bench.settings.model}
    try:
        from skulk_store.store import bundled_cards

        card = bundled_cards().get(bench.settings.model)
        if card is not None:
            info.update({"quantization": card.quantization, "family": card.family})
    except Exception:
        pass
    return info


def print_table(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(
        f"\nSkulk benchmarks {report['started_at']} ({report['mode']}, {report['duration_s']:.0f} s) on "
        f"{m['cpu_model']} x{m['cpu_count']}, {m['memory_total_bytes'] / 2**30:.1f} GiB, load {m['load_average']}"
    )
    print(
        f"model {report['model'].get('id')} {report['model'].get('quantization') or ''}; "
        f"kernel {report['versions'].get('skulk-kernel')}, xllamacpp {report['versions'].get('xllamacpp')}, "
        f"llama-cpp-python {report['versions'].get('llama-cpp-python')}"
    )
    width = 46
    print(f"{'section / metric':<{width}} {'value':>14} {'baseline':>10} {'ratio':>8}  goal")
    for name, sec in report["sections"].items():
        reason = str(sec["reason"] or "").split("\n")[0]
        status = (
            ""
            if sec["status"] == "ok"
            else (f"  [{reason}]" if reason.startswith(sec["status"]) else f"  [{sec['status']}: {reason}]")
        )
        print(f"-- {name}{status}")
        for row in sec["rows"]:
            value = row["value"]
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            shown = f"{shown} {row['unit']}".strip()
            base = row["baseline"]
            base = f"{base:.4g}" if isinstance(base, float) else ("" if base is None else str(base))
            rat = row["ratio"]
            rat = f"{rat:.3f}" if isinstance(rat, (int, float)) else ""
            print(f"  {row['metric'][: width - 2]:<{width - 2}} {shown:>14} {base:>10} {rat:>8}  {row['goal'] or ''}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests, concurrency 1 and 4 only (< 3 min)")
    ap.add_argument("--tiny", action="store_true", help="the smallest counts (for the harness's own test)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON report and plots")
    ap.add_argument("--profile", default="cpu-llamacpp", help="node profile (bundled name or .toml path)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="chat model the profile places (e.g. skulk/echo for dev)")
    ap.add_argument(
        "--models-dir",
        default=str(default_models_dir()),
        help="provisioned models ($SKULK_MODELS_DIR, else $SKULK_TEST_MODELS_DIR, else <tmp>/skulk-test-models)",
    )
    ap.add_argument("--skip-inprocess", action="store_true", help="no in-process engine baseline in `serving`")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    ap.add_argument("--levels", default="", help="concurrency levels, e.g. 1,2,4 (overrides the mode's)")
    ap.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for a node or model")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)

    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    settings = settings_from(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    json_path = out_dir / f"{stamp}.json"

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally blocks: every node is stopped

    signal.signal(signal.SIGTERM, on_signal)
    bench = Bench(settings)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "started_at": utc_now(),
        "finished_at": None,
        "duration_s": 0.0,
        "mode": "tiny" if args.tiny else "quick" if args.quick else "full",
        "command": [Path(sys.executable).name, *sys.argv],
        "settings": settings.as_json(),
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_info(),
        "model": {"id": settings.model},
        "sections": {},
        "summary": {},
        "plots": [],
        "harness": {},
    }
    started = time.perf_counter()
    bodies = {
        "kernel": lambda sec: kernel.run(
            sec, records=settings.kernel_records, repeats=settings.kernel_repeats, events=settings.apply_events
        ),
        "serving": lambda sec: serving.run(sec, bench),
        "concurrency": lambda sec: concurrency.run(sec, bench),
        "coldstart": lambda sec: coldstart.run(sec, bench),
        "cluster": lambda sec: cluster.run(sec, bench),
    }
    try:
        for name, title in SECTIONS.items():
            section = Section(name, title)
            if name not in wanted:
                section.skip("skipped: not selected (--sections)")
            else:
                if name == "coldstart" and bench.node is not None:
                    bench.node.stop()  # cold starts are measured with nothing else of ours running
                run_section(section, bodies[name], log)
            report["sections"][name] = section.to_json()
    finally:
        pids = nodes.started_pids()
        bench.close()
        report["harness"] = {
            "node_pids": pids,
            "nodes_started": len(pids),
            "network_version": bench.network_version,
            "all_stopped": all(not nodes.alive(n) for n in nodes.STARTED),
        }
        report["model"] = model_block(bench)
        report["finished_at"] = utc_now()
        report["duration_s"] = round(time.perf_counter() - started, 2)
        report["machine_end"] = {"load_average": load_average()}
        report["summary"] = {
            f"{name}.{key}": entry["value"]
            for name, sec in report["sections"].items()
            for key, entry in sec["ratios"].items()
        }
        for name in SECTIONS:  # an interrupted run still says which sections never ran
            report["sections"].setdefault(
                name,
                Section(
                    name, SECTIONS[name], status="skipped", reason="skipped: not reached (run interrupted)"
                ).to_json(),
            )
        if args.no_plots:
            report["plots"] = {"skipped": "--no-plots"}
        elif not plots.available():
            log(plots.INSTALL_HINT)
            report["plots"] = {"skipped": plots.INSTALL_HINT}
        else:
            try:
                report["plots"] = plots.write_all(report, json_path.with_suffix(""))
            except Exception as exc:  # plots must never lose the figures
                report["plots"] = {"error": f"{type(exc).__name__}: {exc}"}
        json_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        log(f"report: {json_path}")
    print_table(report)
    return 1 if any(s["status"] == "error" for s in report["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
