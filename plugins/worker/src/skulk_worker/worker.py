"""The worker: runs whatever State assigns to this node.

It reacts only to applied events (never to commands): an InstanceCreated naming this node spawns
a supervised runner; TaskCreated for one of its runners hands the task over; a Cancelled status
cancels it in the runner; InstanceDeleted stops the runner.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import psutil
from skulk_kernel.api import (
    CommandId,
    DownloadCompleted,
    DownloadFailed,
    DownloadPending,
    FailInstance,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeId,
    NodeSurface,
    Profile,
    RefuseInstancePlacement,
    RunnerId,
    RunnerSpec,
    TaskCreated,
    TaskFailed,
    TaskStatusUpdated,
    catalog,
    new_id,
)

from .supervisor import RunnerSupervisor, weights_share

log = logging.getLogger("skulk.worker")


def runner_options(node: NodeSurface, plugin: str) -> dict[str, Any]:
    """The engine plugin's validated table, defaults filled in (RunnerSpec.options; the engine reads it
    back through its own config model)."""
    config = node.plugin_config(plugin)
    return config.model_dump() if config is not None else dict(node.profile.config_for(plugin))


class Worker:
    def __init__(self, node: NodeSurface, config: Any) -> None:
        self.node = node
        self.config = config
        self.runners: dict[str, RunnerSupervisor] = {}  # runner id -> supervisor
        self._starting: dict[str, asyncio.Task[Any]] = {}
        self.load_misses: dict[str, int] = {}  # model id -> load deadlines missed in a row on this node

    async def on_event(self, indexed: IndexedEvent, before: Any, after: Any) -> None:
        event = indexed.event
        if isinstance(event, InstanceCreated):
            runner_id = event.instance.shard_assignments.node_to_runner.get(self.node.node_id)
            if runner_id is not None and runner_id not in self.runners:
                self._starting[runner_id] = self.node.spawn(
                    self._start_runner(event.instance, runner_id), f"start-{runner_id[:8]}"
                )
        elif isinstance(event, InstanceDeleted):
            inst = before.instances.get(event.instance_id)
            if inst is not None:
                runner_id = inst.shard_assignments.node_to_runner.get(self.node.node_id)
                if runner_id is not None:
                    await self._stop_runner(runner_id)
        elif isinstance(event, TaskCreated):
            inst = after.instances.get(event.task.instance_id)
            if inst is None:
                return
            runner_id = inst.shard_assignments.node_to_runner.get(self.node.node_id)
            sup = self.runners.get(runner_id) if runner_id else None
            serves = getattr(self.node.engines.get(sup.engine_name), "serves_requests", None) if sup else None
            if sup is not None and (not callable(serves) or serves(sup.spec.shard)):
                sup.submit(event.task)  # every rank of a collective; a rank that only lends memory, none
        elif (isinstance(event, TaskStatusUpdated) and event.status == "Cancelled") or isinstance(event, TaskFailed):
            for sup in self.runners.values():
                sup.cancel(event.task_id)

    async def reconcile(self, state: Any) -> None:
        """After a snapshot: run exactly the shards State assigns here, no more, no fewer."""
        wanted = {}
        for inst in state.instances.values():
            runner_id = inst.shard_assignments.node_to_runner.get(self.node.node_id)
            if runner_id is not None:
                wanted[runner_id] = inst
        for runner_id in set(self.runners) - set(wanted):
            await self._stop_runner(runner_id)
        for runner_id, inst in wanted.items():
            if runner_id not in self.runners and runner_id not in self._starting:
                self._starting[runner_id] = self.node.spawn(
                    self._start_runner(inst, runner_id), f"start-{runner_id[:8]}"
                )

    # ------------------------------------------------------------------ runners

    def _model_path(self, card: Any, progress: Any) -> Path | None:
        source = card.sections.get("source", {})
        if source.get("kind") == "local":  # an operator-added model: the files are where they said
            path = Path(source["path"])
            if not path.exists():
                raise FileNotFoundError(f"{path} does not exist on this node")
            return path
        model_id = card.model_id
        for store in self.node.model_stores.values():
            ensure = getattr(store, "ensure_local", None)
            found = ensure(model_id, progress) if ensure else store.local_path(model_id)
            if found is not None:
                return Path(found)
        return None

    def _memory_refusal(self, instance: Any, shard: Any, card: Any) -> str | None:
        """The pre-spawn guard: the master's own estimate against the pool it admitted from, live.

        The need is what the master's planner reserved for this node (weights x overhead, KV for
        the instance's context and KV type, floor), and the pool is the planner's rule: free VRAM
        for a discrete-GPU backend, RAM otherwise. A shortfall beyond the tolerance (live readings
        against gossiped ones) refuses the placement here, before a runner is spawned. An instance
        made by hand (`POST /instance`) has no reservation: its weights are the need.
        """
        from skulk_master.memory import DISCRETE_GPU_COMPUTES

        reserved = instance.reserved_bytes.get(self.node.node_id)
        need = float(reserved) if reserved else weights_share(card, shard)
        what = "the master reserved" if reserved else "its weights need"
        pool, available = "RAM", psutil.virtual_memory().available
        gpus = [g for g in self.node.facts.get("gpus", ()) if g.get("vram_free_bytes") is not None]
        if shard.backend.rpartition("-")[2] in DISCRETE_GPU_COMPUTES and gpus:
            pool, available = "VRAM", sum(int(g["vram_free_bytes"]) for g in gpus)
        if need > available * (1 + self.config.memory_tolerance):
            return f"{what} {need / 2**20:.0f} MiB but only {available / 2**20:.0f} MiB of {pool} is available now"
        return None

    async def _start_runner(self, instance: Any, runner_id: str) -> None:
        try:
            await self._start_runner_inner(instance, runner_id)
        finally:
            self._starting.pop(runner_id, None)

    async def _start_runner_inner(self, instance: Any, runner_id: str) -> None:
        shard = instance.shard_assignments.runner_to_shard[runner_id]
        model_id = instance.shard_assignments.model_id
        card = catalog(self.node).get(model_id)
        engine_name = shard.backend.split("-", 1)[0]
        engine = self.node.engines.get(engine_name)
        if card is None or engine is None:
            why = (
                f"model {model_id!r} is not in this node's catalog"
                if card is None
                else f"engine {engine_name!r} is not loaded on this node"
            )
            await self._refuse(instance, why)
            return
        refusal = self._memory_refusal(instance, shard, card)
        if refusal:
            await self._refuse(instance, refusal)
            return
        node_id = self.node.node_id
        await self.node.emit(DownloadPending(node_id=node_id, model_id=model_id))
        loop = asyncio.get_running_loop()

        last_phase: list[str] = []

        def progress(done: int, total: int, phase: str = "") -> None:
            from skulk_kernel.api import DownloadProgress

            if phase and phase not in last_phase:
                last_phase.append(phase)
                log.info("%s: %s", model_id, phase)

            reading = DownloadProgress(
                node_id=node_id, model_id=model_id, downloaded_bytes=done, total_bytes=total, phase=phase
            )
            loop.call_soon_threadsafe(self.node.readings.put, node_id, reading)

        try:
            reads = getattr(engine, "reads_model_files", None)  # a rank fed its weights by a peer needs none
            if callable(reads) and not reads(shard):
                path = None
            else:
                path = await asyncio.to_thread(self._model_path, card, progress)
        except Exception as exc:
            log.exception("could not stage %s", model_id)
            await self.node.emit(DownloadFailed(node_id=node_id, model_id=model_id, error_message=str(exc)))
            self.node.spawn(
                self.node.submit(
                    FailInstance(
                        command_id=CommandId(new_id()),
                        instance_id=instance.instance_id,
                        reason=f"could not stage {model_id} on {node_id}: {exc}",
                        replace_excluding=NodeId(node_id),
                    )
                ),
                "submit",
            )
            return
        await self.node.emit(DownloadCompleted(node_id=node_id, model_id=model_id, total_bytes=card.storage_size))
        if instance.instance_id not in self.node.state.instances:
            return  # deleted while staging
        owner_plugin = self.node.engine_owner(engine_name)
        profile = Profile(
            name=f"runner:{engine_name}",
            plugins=(owner_plugin,),
            plugin_config={owner_plugin: self.node.profile.config_for(owner_plugin)},
        )
        spec = RunnerSpec(
            instance_id=instance.instance_id,
            runner_id=runner_id,
            shard=shard,
            card=card,
            model_path=path,
            options=runner_options(self.node, owner_plugin),
            group=instance.group,
            context_limit=instance.context_limit,
            kv_cache_type=instance.kv_cache_type,
        )
        sup = RunnerSupervisor(
            self.node, spec, engine_name, profile, instance.context_limit, self.config, load_misses=self.load_misses
        )
        self.runners[runner_id] = sup
        sup.start()

    async def _refuse(self, instance: Any, reason: str) -> None:
        log.error("refusing instance %s: %s", instance.instance_id, reason)
        self.node.spawn(
            self.node.submit(
                RefuseInstancePlacement(
                    command_id=CommandId(new_id()),
                    instance_id=instance.instance_id,
                    node_id=self.node.node_id,
                    reason=reason,
                )
            ),
            "submit",
        )

    async def _stop_runner(self, runner_id: str) -> None:
        starting = self._starting.pop(runner_id, None)
        if starting is not None:
            starting.cancel()
        sup = self.runners.pop(runner_id, None)
        if sup is not None:
            await sup.stop()

    async def stop(self) -> None:
        await asyncio.gather(*(self._stop_runner(r) for r in list(self.runners)), return_exceptions=True)

    def diagnostics(self) -> list[dict[str, Any]]:
        out = []
        for runner_id, sup in self.runners.items():
            status = self.node.state.runners.get(RunnerId(runner_id))
            out.append(
                {
                    "runnerId": runner_id,
                    "statusKind": type(status).__name__ if status else "Unknown",
                    "modelId": sup.spec.card.model_id,
                    "phase": "serving" if sup.ready else "starting",
                    "pid": sup.process.pid if sup.process else None,
                    "inFlight": len(sup.in_flight),
                    "speculative": {
                        "drafted": sup.drafted,
                        "accepted": sup.draft_accepted,
                        "acceptance": round(sup.draft_accepted / sup.drafted, 4) if sup.drafted else None,
                    },
                }
            )
        return out
