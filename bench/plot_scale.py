"""Plots of a bench_scale report against N: what grows with the cluster's size and what stays flat.

Run: ``python bench/plot_scale.py [bench/results/scale.json]``; writes ``scale.png`` beside the
report. Needs matplotlib (optional, like bench/run.py's plots: ``.venv/bin/python -m pip install
matplotlib``); without it, says so and exits 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite import plots


def series(results: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """{panel title: {line label: values in N order}}."""

    def msg(plane: str, key: str) -> list[float]:
        return [r["idle"]["messages"][plane][key] for r in results]

    return {
        "seconds": {
            "election after kill -9 of the master": [r["election"]["elected_after_s"] for r in results],
            "late joiner's sync": [r["late_joiner"]["sync_s"] for r in results],
            "hashes agree after 1,000 commands": [r["burst"]["agreed_after_s"] for r in results],
        },
        "join of all N (s)": {"join": [r["join_s"] for r in results]},
        "idle CPU (% of one core)": {
            "follower (median)": [r["idle"]["cpu_pct_follower_median"] for r in results],
            "master": [r["idle"]["cpu_pct_master"] for r in results],
        },
        "messages per second, a follower": {
            "control sent": msg("control", "follower_sent_per_s"),
            "control received": msg("control", "follower_received_per_s"),
            "telemetry sent": msg("telemetry", "follower_sent_per_s"),
            "telemetry received": msg("telemetry", "follower_received_per_s"),
        },
        "messages per second, the master": {
            "received (control + telemetry)": [
                r["idle"]["messages"]["control"]["master_received_per_s"]
                + r["idle"]["messages"]["telemetry"]["master_received_per_s"]
                for r in results
            ],
        },
        "/state (kB)": {"size": [r["state_bytes"] / 1000 for r in results]},
    }


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results" / "scale.json"
    if not plots.available():
        print(plots.INSTALL_HINT, file=sys.stderr)
        return 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(path.read_text())
    results = sorted(report["results"], key=lambda r: r["n"])
    ns = [r["n"] for r in results]
    panels = series(results)
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (title, lines) in zip(axes.flat, panels.items(), strict=True):
        for label, values in lines.items():
            ax.plot(ns, values, marker="o", label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("nodes (N)")
        ax.set_xticks(ns)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"bench_scale, {report['at']}, {report['cpus']} CPUs, one host", fontsize=11)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=100)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
