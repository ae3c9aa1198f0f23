"""Forming the mx.distributed ring group of a multi-rank instance, and pinning ranks to cores.

The planner stamps a `RankGroup` on the instance: ``hosts[r]`` is the ``ip:port`` rank r
listens on. MLX's ring backend reads its peers from a JSON hostfile (``MLX_HOSTFILE``, one list
of addresses per rank) and this process's rank from ``MLX_RANK``; only neighbour ranks
(r-1, r+1 around the ring) are connected, which is all a pipeline needs. MLX's `init` holds the GIL
while it connects and cannot be interrupted, so the ranks first meet in plain Python
(`rendezvous`, which honours the formation deadline and names a missing peer) and only then call
it, on the compute thread.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from skulk_kernel.api import RankGroup

from .compute import CollectiveTimeout, ComputeThread
from .rendezvous import rendezvous

if TYPE_CHECKING:
    import mlx.core as mx

log = logging.getLogger("skulk.engine_mlx")


def write_hostfile(group: RankGroup, directory: Path | None = None) -> Path:
    """The ring backend's hostfile for `group`: ``[["ip:port"], ["ip:port"], ...]``."""
    fd, name = tempfile.mkstemp(prefix="skulk-mlx-hosts-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump([[host] for host in group.hosts], f)
    return Path(name)


def host_ip(address: str) -> str:
    return address.rsplit(":", 1)[0]


def local_index(group: RankGroup, rank: int) -> tuple[int, int]:
    """(position of `rank` among the ranks on its host, how many ranks share that host)."""
    mine = host_ip(group.hosts[rank])
    same = [r for r, h in enumerate(group.hosts) if host_ip(h) == mine]
    return same.index(rank), len(same)


def pin_to_core(group: RankGroup, rank: int) -> list[int] | None:
    """Pin every thread of this process to one core when several ranks share this host.

    Why: the ring backend busy-waits in its send/recv loops; on a small host two ranks spinning
    on the same cores starve each other (measured 3-4x slower on 2 cores). Linux only; returns
    the cores used, or None when nothing was pinned.
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    position, sharing = local_index(group, rank)
    if sharing < 2:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    chosen = [cores[position % len(cores)]]
    tasks = Path("/proc/self/task")
    tids = [int(p.name) for p in tasks.iterdir()] if tasks.is_dir() else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, chosen)
        except OSError:
            pass
    log.info("rank %d pinned to core %s (%d ranks on this host)", rank, chosen, sharing)
    return chosen


def _peers_text(group: RankGroup, rank: int) -> str:
    size = len(group.hosts)
    neighbours = sorted({(rank - 1) % size, (rank + 1) % size} - {rank})
    names = [f"rank {r} at {group.hosts[r]}" for r in neighbours]
    if len(names) == 1:
        return f"peer {names[0]} never joined"
    return "peer " + " or ".join(names) + " never joined"


def form_group(group: RankGroup, rank: int, compute: ComputeThread) -> mx.distributed.Group:
    """Join the ring as `rank`; raise TimeoutError with the reason after the formation deadline."""
    size = len(group.hosts)
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside a group of {size} hosts")
    rendezvous(group, rank)  # raises FormationTimeout (a TimeoutError) naming the missing peer
    hostfile = write_hostfile(group)
    os.environ["MLX_HOSTFILE"] = str(hostfile)
    os.environ["MLX_RANK"] = str(rank)

    def init() -> mx.distributed.Group:
        import mlx.core as mx

        return mx.distributed.init(strict=True, backend="ring")

    try:
        # Every rank is starting now; MLX's own connect retries (about 31 s) cover the stragglers.
        world = compute.call(init, max(60.0, group.formation_deadline_s), "forming the ring group")
    except CollectiveTimeout:
        raise TimeoutError(
            f"rank {rank} of {size} could not form its group within {group.formation_deadline_s:g} s: "
            f"{_peers_text(group, rank)}"
        ) from None
    finally:
        hostfile.unlink(missing_ok=True)
    if world.size() != size or world.rank() != rank:
        raise RuntimeError(f"ring group formed as rank {world.rank()} of {world.size()}, expected {rank} of {size}")
    log.info("rank %d of %d joined its ring group", rank, size)
    return world
