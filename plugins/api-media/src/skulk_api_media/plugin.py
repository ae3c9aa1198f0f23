"""Entry point of the media jobs plugin: hookimpls only, light imports."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from skulk_kernel import hookimpl
from skulk_kernel.api import NodeSurface, ServiceKey

from .config import PLUGIN, MediaConfig

if TYPE_CHECKING:
    from .jobs import JobStore

log = logging.getLogger("skulk.media")
JOBS: ServiceKey[JobStore] = ServiceKey(PLUGIN)  # the node's job store (private to this plugin)


def _config(node: NodeSurface) -> MediaConfig:
    return node.plugin_config(PLUGIN) or MediaConfig()


def _store(node: NodeSurface) -> JobStore:
    """The node's job store, made on first use (routes are registered before startup runs)."""
    store = node.services.get(JOBS)
    if store is None:
        from .jobs import JobStore

        config = _config(node)
        root = Path(config.jobs_dir) if config.jobs_dir else Path(node.options.home) / PLUGIN / "videos"
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.mp4*"):  # records are in memory: files of a previous run are orphans
            stale.unlink(missing_ok=True)
        store = JobStore(root, config.job_ttl_s, config.max_jobs, config.max_active_jobs)
        node.services.publish(JOBS, store)
    return store


@hookimpl
def register_config(register: Callable[[str, type[BaseModel]], None]) -> None:
    register(PLUGIN, MediaConfig)


@hookimpl
def register_api_routes(app: Any, node: NodeSurface) -> None:
    from .routes import add_video_routes

    add_video_routes(app, node, _store(node), _config(node))


async def _sweep_loop(node: NodeSurface, interval: float) -> None:
    while not node.stopping:
        await asyncio.sleep(interval)
        store = node.services.get(JOBS)
        if store is not None:
            for job_id in store.sweep():
                log.info("video job %s expired; it and its file are deleted", job_id)


@hookimpl
def startup(node: NodeSurface) -> None:
    _store(node)
    node.spawn(_sweep_loop(node, _config(node).sweep_interval_s), "api-media-sweep")


@hookimpl
def shutdown(node: NodeSurface) -> None:
    store = node.services.withdraw(JOBS)
    if store is not None:
        for job in list(store.jobs.values()):
            if job.task is not None and not job.task.done():
                job.task.cancel()


@hookimpl
def plugin_fits(facts: dict[str, Any], chosen: list[str]) -> tuple[bool, str] | None:
    """auto: in when a media engine is in (the routes of an image or video engine need it)."""
    engines = [name for name in chosen if name in ("engine-diffusers", "video-comfyui")]
    if not engines:
        return False, "no media engine is in (engine-diffusers and video-comfyui need their environments)"
    return True, f"serves {', '.join(engines)}"
