"""Admission decisions before and after [capacity], for real model geometries on common machines.

Run: ``python bench/bench_admission.py``; prints a table (``--json`` for JSON). Pure arithmetic
over the master's planner: no node, no model files.

"Before" is the old rule, computed in the same run: KV charged for the card's whole context at
f16, the instance stamped with that context. "After" is the planner as it is: without
``context_tokens`` the largest context that fits (never above 32,768); the card asked at its whole
context (f16: a refusal names the largest context that fits), and so with a q8_0 KV cache.
Machines are Linux nodes of 16, 24, 64 and 192 GB with 2 GB in use (``llama_server-cpu``: RAM is
the pool), and the same sizes as Macs (``mlx-metal``: unified memory, bounded by the Metal working
set). "no (fits N)": refused, and the refusal says N tokens would fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for src in ("kernel/src", "testing/src", "plugins/master/src"):
    sys.path.insert(0, str(ROOT / src))

from skulk_kernel.api import ModelCard, PlacementError, PlacementRequest, State  # noqa: E402
from skulk_master.memory import GiB  # noqa: E402
from skulk_master.planner import MemoryPlanner  # noqa: E402
from skulk_testing.geometry import LLAMA_8B, LLAMA_70B, QWEN_32B, QWEN_32B_YARN, machine  # noqa: E402

MACHINES_GB = (16, 24, 64, 192)
USED_GB = 2.0


def _decide(card: ModelCard, total_gb: int, mac: bool, **request: Any) -> str:
    backend = "mlx-metal" if mac else "llama_server-cpu"
    node = machine("n", total_gb, used_gb=USED_GB, backends=(backend,), os="Darwin" if mac else "Linux")
    card = card.model_copy(update={"compatible_backends": (backend,)})
    try:
        inst = MemoryPlanner().place(PlacementRequest(model=card, **request), State(), {"n": node}, "bench")
    except PlacementError as exc:
        hint = exc.message.rpartition("the largest context that fits is ")[2].split(" ")[0]
        return f"no (fits {hint})" if hint.isdigit() else "no"
    return f"{inst.context_limit // 1024}k, {inst.reserved_bytes['n'] / GiB:.1f} GiB"


def _before(card: ModelCard, total_gb: int) -> str:
    """The old rule: weights x 1.25 + KV for the card's whole context at f16 + 256 MiB vs RAM available."""
    need = MemoryPlanner().need_bytes(card, 1.0, 1)  # context None: the whole card's
    free = machine("n", total_gb, used_gb=USED_GB).ram_available
    return f"{card.context_length // 1024}k, {need / GiB:.1f} GiB" if need < free else f"no ({need / GiB:.1f} GiB)"


def rows() -> list[dict[str, Any]]:
    out = []
    for card in (LLAMA_8B, QWEN_32B, QWEN_32B_YARN, LLAMA_70B):
        for gb in MACHINES_GB:
            out.append(
                {
                    "model": card.model_id.rpartition("/")[2],
                    "machine_gb": gb,
                    "before": _before(card, gb),
                    "after_default": _decide(card, gb, False),
                    "after_full_ctx_f16": _decide(card, gb, False, context_tokens=card.context_length),
                    "after_full_ctx_q8_0": _decide(
                        card, gb, False, context_tokens=card.context_length, kv_cache_type="q8_0"
                    ),
                    "after_mac_default": _decide(card, gb, True),
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    table = rows()
    if parser.parse_args().json:
        print(json.dumps(table, indent=2))
        return
    head = tuple(table[0])
    widths = [max(len(h), *(len(str(r[h])) for r in table)) for h in head]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for r in table:
        print(" | ".join(str(r[h]).ljust(w) for h, w in zip(head, widths, strict=True)))


if __name__ == "__main__":
    main()
