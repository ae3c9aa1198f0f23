"""PNG plots of a report (matplotlib, Agg backend). Optional: without matplotlib the report says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

INSTALL_HINT = "matplotlib is not installed: .venv/bin/python -m pip install matplotlib  (then re-run)"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_all(report: dict[str, Any], stem: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = report["sections"]
    machine = report["machine"]
    footer = (
        f"{report['started_at']}  {machine['cpu_model']} x{machine['cpu_count']}  "
        f"{machine['memory_total_bytes'] / 2**30:.0f} GiB  model {report['model'].get('id')} "
        f"{report['model'].get('quantization') or ''}"
    )
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.text(0.01, 0.005, footer, fontsize=6, color="#555")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        path = stem.with_name(f"{stem.name}-{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

    kernel = sections.get("kernel", {})
    if kernel.get("status") == "ok":
        rows = [r for r in kernel["rows"] if r["baseline"]]
        fig, ax = plt.subplots(figsize=(7, 3.2))
        names = [r["metric"] for r in rows]
        ax.barh(names, [r["ratio"] for r in rows], color="#4c72b0")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("throughput / raw msgpack baseline (same run)")
        ax.set_title("kernel: event log and apply()")
        save(fig, "kernel")

    serving = sections.get("serving", {})
    if serving.get("status") == "ok":
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        pairs = serving["results"].get("pairs", [])
        idx = list(range(len(pairs)))
        axes[0].plot(idx, [p["node"]["decode_tok_s"] for p in pairs], "o-", label="node /v1/chat/completions")
        if any("inprocess" in p for p in pairs):
            axes[0].plot(
                idx,
                [p.get("inprocess", {}).get("decode_tok_s") for p in pairs],
                "s--",
                label="in-process LlamaServer.chat",
            )
        axes[0].set_xlabel("request (alternating order)")
        axes[0].set_ylabel("decode tok/s")
        axes[0].legend(fontsize=7)
        axes[0].set_title("decode rate per request")
        formats = (serving["results"].get("formats") or {}).get("formats", {})
        if formats:
            fmt_names = list(formats)
            axes[1].bar(fmt_names, [formats[n].get("decode_vs_chat") or 0 for n in fmt_names], color="#55a868")
            axes[1].axhline(1.0, color="k", lw=0.8)
            axes[1].set_ylabel("decode tok/s / chat completions")
            axes[1].set_title("wire formats")
        save(fig, "serving")

    conc = sections.get("concurrency", {})
    if conc.get("status") == "ok":
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for k, (backend, data) in enumerate(conc["results"].get("backends", {}).items()):
            levels = data.get("levels", [])
            if not levels:
                continue
            color = f"C{k}"
            xs = [p["concurrency"] for p in levels]
            axes[0].plot(xs, [p["aggregate_tok_s"] for p in levels], "o-", color=color, label=backend)
            axes[1].plot(xs, [p["ttft_ms"]["p50"] for p in levels], "o-", color=color, label=f"{backend} p50")
            axes[1].plot(xs, [p["ttft_ms"]["p90"] for p in levels], "x--", color=color, label=f"{backend} p90")
        for ax, label in ((axes[0], "aggregate tok/s"), (axes[1], "TTFT ms")):
            ax.set_ylim(bottom=0)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
        axes[0].set_title("throughput")
        axes[1].set_title("time to first token")
        save(fig, "concurrency")

    cluster = sections.get("cluster", {})
    if cluster.get("status") == "ok" and cluster["results"].get("joins"):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        joins = cluster["results"]["joins"]
        axes[0].plot([j["log_length"] for j in joins], [j["synced_s"] for j in joins], "o-", label="synced")
        axes[0].plot([j["log_length"] for j in joins], [j["api_up_s"] for j in joins], "x--", label="API up")
        axes[0].set_xlabel("log length (events)")
        axes[0].set_ylabel("seconds from spawn")
        axes[0].legend(fontsize=7)
        axes[0].set_title("join time vs log length (echo-engine nodes)")
        lat = cluster["results"].get("command_latency_ms", {})
        names = [k for k in ("on_master", "on_follower") if lat.get(k, {}).get("n")]
        for i, key in enumerate(("p50", "p90", "p99")):
            axes[1].bar([j + i * 0.25 for j in range(len(names))], [lat[n][key] for n in names], width=0.25, label=key)
        axes[1].set_xticks([j + 0.25 for j in range(len(names))], names)
        axes[1].set_ylabel("ms")
        axes[1].legend(fontsize=7)
        axes[1].set_title("command latency")
        save(fig, "cluster")
    return written
