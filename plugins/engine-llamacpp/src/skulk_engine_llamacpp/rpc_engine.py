"""``llama_rpc``: one GGUF over several nodes, through llama.cpp's RPC backend (memory pooling).

Rank 0 drives: it runs the RPC build's ``llama-server`` as a child process with the other ranks as
RPC devices (``--rpc``, each through a member tunnel, :mod:`.rpc_tunnel`), keeps the first layers,
the embeddings and the output layer itself, and offloads the rest (``-ngl``) split across the ranks
by the planner's layer shares (``--tensor-split``), so each node holds what it was charged. Every
other rank runs ``ggml-rpc-server`` on loopback behind its tunnel and holds the layers and KV cache
the driver sends it; it takes no requests itself (its runner answers each task at once, the driver
streams). The driver's HTTP API is llama.cpp's own server, so the session is the ``llama_server``
one (:class:`.server_backend.LlamaServer`) pointed at a child process instead of an in-process one.

Failure: llama.cpp aborts the driver when an RPC peer goes away ("Remote RPC server crashed"), so a
rank's death ends the driver: the stream in flight fails, and a watcher reports the group broken to
the runner, which fails the instance with the reason so the master places it again. A rank whose
rpc-server dies reports the same from its side. Ranks that never answer fail the load within the
group's formation deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from skulk_kernel.api import Chunk, EngineProbe, ErrorChunk, RunnerSpec, Sharding, TextGenerationParams

from .admission import TokenGate
from .engine import LlamaSession, _LlamaEngine
from .events import BackendError
from .plugin import llamacpp_config
from .rpc_build import RpcBuild, find_build
from .rpc_tunnel import MemberTls, Tunnels
from .server_backend import EXACT_UBATCH, LlamaServer

log = logging.getLogger("skulk.engine.llamacpp.rpc")
RANK_FAILED = "rank_failed"  # the runner's code for "the group is unusable" (skulk_worker.runner)
START_TIMEOUT_S = 600.0


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _death_signal() -> Callable[[], None] | None:
    """A pre-exec hook that asks Linux to SIGKILL the child when the runner that started it dies
    (``PR_SET_PDEATHSIG``), so a runner killed outright (its node's kill -9) never leaves a llama.cpp
    process holding a model's memory. Resolved before the fork: the child only makes one call."""
    if not sys.platform.startswith("linux"):
        return None  # macOS has no such call: there the runner's own exit path stops its children
    import ctypes
    import ctypes.util

    prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    return lambda: prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
    """A llama.cpp process of this runner: its own session (a terminal's Ctrl-C is the node's to
    handle), killed with the runner. Started from the runner's main thread (``Engine.load``): the
    death signal follows the thread that forked."""
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=None, start_new_session=True, preexec_fn=_death_signal()
    )


def _wait_port(port: int, process: subprocess.Popen[bytes], deadline_s: float, what: str) -> None:
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        if process.poll() is not None:
            raise BackendError(f"{what} exited with code {process.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise BackendError(f"{what} did not listen on 127.0.0.1:{port} within {deadline_s:.0f} s")


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def tensor_split(shares: list[tuple[int, int]], local_gpu: bool = False) -> tuple[int, list[int]]:
    """(``-ngl``, ``--tensor-split``) from the ranks' layer shares, in rank order.

    A CPU driver: llama.cpp offloads the *last* ``-ngl`` layers to the devices (the RPC ranks, in
    ``--rpc`` order) and keeps the rest, rank 0's [0, end), on its CPU. A GPU driver: every layer and
    the output go to devices, its own GPU first (llama.cpp lists local devices before RPC ones), so
    the split names rank 0's share too."""
    counts = [end - start for start, end in shares]
    if local_gpu:
        return sum(counts) + 1, counts
    return sum(counts[1:]), counts[1:]


class RpcLlamaServer(LlamaServer):
    """llama.cpp's server from the RPC build, as a child process driving the other ranks."""

    def __init__(self, build: RpcBuild, rpc: list[str], ngl: int, split: list[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.build = build
        self.rpc = rpc  # 127.0.0.1:port of each rank's tunnel, in rank order
        self.ngl = ngl
        self.split = split
        self.process: subprocess.Popen[bytes] | None = None

    def command(self, port: int) -> list[str]:
        """The server's arguments: the same settings as the in-process server (``_params``)."""
        cmd = [
            str(self.build.server), "-m", str(self.model_path), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(self.n_parallel), "-t", str(self.n_threads), "-tb", str(self.n_threads_batch),
            "--threads-http", str(max(16, 4 * self.n_parallel)), "--props", "--slots", "--metrics", "--no-webui",
            "--cache-ram", str(self.cache_ram_mib), "--jinja", "--kv-unified", "-fa", "on", "--fit", "off",
            "--load-mode", "none",  # each node's memory holds its share only (a mapped file would count whole)
            # the ranks hold weights in the plain layout (an RPC buffer is never repacked); rank 0 does the
            # same, so a split computes exactly what one process does (x86 repacks Q4_0/Q4_K for its GEMM)
            "--no-repack",
            "-ub", str(self.n_ubatch or EXACT_UBATCH), "--verbosity", str(self.verbosity),
        ]  # fmt: skip
        if self._n_ctx_req:
            cmd += ["-c", str(self._n_ctx_req)]
        if self.n_batch:
            cmd += ["-b", str(self.n_batch)]
        if self.cache_type != "f16":
            cmd += ["-ctk", self.cache_type, "-ctv", self.cache_type]
        if self.rpc:
            cmd += ["--rpc", ",".join(self.rpc), "-ngl", str(self.ngl), "-ts", ",".join(map(str, self.split))]
        else:
            cmd += ["-ngl", "0"]
        return cmd

    def start(self) -> RpcLlamaServer:
        import httpx

        template = self._chat_template()
        port = free_loopback_port()
        cmd = self.command(port)
        template_file = None
        if template is not None:
            template_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"skulk-rpc-template-{port}.jinja"
            template_file.write_text(template)
            cmd += ["--chat-template-file", str(template_file)]
        log.info("starting %s", " ".join(cmd))
        self.process = spawn(cmd)
        try:
            _wait_port(port, self.process, START_TIMEOUT_S, "llama-server (RPC driver)")
            self.base_url = f"http://127.0.0.1:{port}"
            self._http = httpx.Client(
                base_url=self.base_url,
                timeout=httpx.Timeout(self.request_timeout_s, connect=10.0),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            )
            self._wait_loaded()
        except BaseException:
            _stop(self.process)
            raise
        finally:
            if template_file is not None:
                template_file.unlink(missing_ok=True)
        self.props = self._get("/props")
        settings = self.props.get("default_generation_settings") or {}
        self.context_length = int(settings.get("n_ctx") or self.props.get("n_ctx") or 0)
        return self

    def _wait_loaded(self) -> None:
        """llama.cpp's server listens before the model is loaded and answers /health 503 meanwhile."""
        until = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < until:
            assert self.process is not None
            if self.process.poll() is not None:
                raise BackendError(
                    f"llama-server (RPC driver) exited with code {self.process.returncode} while loading"
                )
            with contextlib.suppress(Exception):
                if self._client().get("/health").status_code == 200:
                    return
            time.sleep(0.2)
        raise BackendError(f"llama-server (RPC driver) did not load within {START_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        _stop(self.process)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class RpcDriverSession(LlamaSession):
    """Rank 0: llama_server's session over the driver; a dead driver means the group is broken."""

    def __init__(self, server: RpcLlamaServer, spec: RunnerSpec, tag: str, gate: TokenGate, tunnels: Tunnels) -> None:
        super().__init__(server, spec, tag, gate)
        self.server = server
        self.tunnels = tunnels
        self.broken: str | None = None

    def _why_broken(self) -> str | None:
        process = self.server.process
        if process is None or process.poll() is None:
            return None
        if self.broken is None:
            peers = ", ".join(dict.fromkeys(self.tunnels.stats.closed_by_peer[-3:])) or "none seen"
            self.broken = (
                f"the llama.cpp RPC driver of {self.spec.card.model_id} exited (code {process.returncode}): "
                f"a rank's connection was lost (closed: {peers})"
            )
        return self.broken

    def watch_group(self, report: Callable[[str], None]) -> None:
        """Report the group broken as soon as the driver exits, with or without a request in flight."""

        def watch() -> None:
            process = self.server.process
            if process is None:
                return
            process.wait()
            if not getattr(self, "_closing", False) and (why := self._why_broken()):
                log.error("%s", why)
                report(why)

        threading.Thread(target=watch, daemon=True, name="rpc-driver-watch").start()

    def generate(self, command_id: str, params: TextGenerationParams, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        if why := self._why_broken():
            yield ErrorChunk(command_id=command_id, seq=0, message=why, code=RANK_FAILED)
            return
        for chunk in super().generate(command_id, params, cancelled):
            if isinstance(chunk, ErrorChunk):
                time.sleep(0.3)  # an abort mid-stream: let the process finish dying before asking
                if why := self._why_broken():
                    yield ErrorChunk(command_id=command_id, seq=chunk.seq, message=why, code=RANK_FAILED)
                    return
            yield chunk

    def close(self) -> None:
        self._closing = True
        super().close()
        self.tunnels.close()


class RpcRankSession:
    """Rank k > 0: ``ggml-rpc-server`` on loopback, a member tunnel in front of it. It takes no
    requests (``LlamaRpcEngine.serves_requests``): it implements no task kind, only `close` and
    `watch_group`."""

    def __init__(self, process: subprocess.Popen[bytes], tunnels: Tunnels, spec: RunnerSpec) -> None:
        self.process = process
        self.tunnels = tunnels
        self.spec = spec
        self._closing = False

    def _why_broken(self) -> str | None:
        if self.process.poll() is None:
            return None
        return f"ggml-rpc-server of rank {self.spec.shard.device_rank} exited (code {self.process.returncode})"

    def watch_group(self, report: Callable[[str], None]) -> None:
        def watch() -> None:
            self.process.wait()
            if not self._closing and (why := self._why_broken()):
                report(why)

        threading.Thread(target=watch, daemon=True, name="rpc-rank-watch").start()

    def close(self) -> None:
        self._closing = True
        _stop(self.process)
        self.tunnels.close()


class LlamaRpcEngine(_LlamaEngine):
    """llama.cpp over several nodes with its RPC backend (pipeline: each rank holds a span of layers)."""

    name = "llama_rpc"
    module = "skulk_engine_llamacpp"
    dist = "skulk-engine-llamacpp"
    tasks = frozenset({"TextGeneration"})
    dispatch_width = 64
    splits: frozenset[Sharding] = frozenset({"Pipeline"})

    def serves_requests(self, shard: Any) -> bool:
        """Only the driver takes requests; a rank's part of each happens inside its rpc-server, so its
        worker sends it none (its session serves no task kind: it lends memory)."""
        return bool(shard.device_rank == 0)

    def reads_model_files(self, shard: Any) -> bool:
        """Only the driver reads the GGUF; a rank receives its tensors over RPC, so its node stages
        nothing (a 40 GB model is not copied to every machine that lends memory)."""
        return bool(shard.device_rank == 0)

    def probe(self) -> EngineProbe:
        build = find_build()
        if build is None:
            return EngineProbe(
                False, reason="no RPC build of llama.cpp: run `skulk-kernel engines install llamacpp-rpc`"
            )
        try:
            import skulk_transport_zenoh.tls  # noqa: F401  (the member identities the tunnels use)
        except ImportError:
            return EngineProbe(False, reason="skulk-transport-zenoh (the cluster's TLS identities) is not installed")
        return EngineProbe(True, version=build.describe())

    def build(self) -> Any:
        build = find_build()
        return build.compute if build is not None else "cpu"

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        return [f"{self.name}-{self.build()}"] if self.probe().available else []

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> Any:
        build = find_build()
        if build is None:
            raise BackendError("no RPC build of llama.cpp on this node (skulk-kernel engines install llamacpp-rpc)")
        config = llamacpp_config(spec.options)
        shard = spec.shard
        group = spec.group
        if shard.world_size > 1 and (group is None or len(group.hosts) != shard.world_size):
            raise BackendError(
                f"a {shard.world_size}-rank shard needs a group of {shard.world_size} hosts, got {group}"
            )
        tunnels = Tunnels(MemberTls.of_this_node())
        try:
            if shard.device_rank > 0:
                assert group is not None
                return self._load_rank(build, spec, group.hosts[shard.device_rank], tunnels, config.n_threads_batch)
            return self._load_driver(build, spec, tunnels, config, progress)
        except BaseException:
            tunnels.close()
            raise

    def _load_rank(self, build: RpcBuild, spec: RunnerSpec, listen: str, tunnels: Tunnels, threads: int | None) -> Any:
        port = free_loopback_port()
        cmd = [str(build.rpc_server), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads or os.cpu_count() or 1)]
        log.info("rank %d: %s, tunnel at %s", spec.shard.device_rank, " ".join(cmd), listen)
        process = spawn(cmd)
        try:
            _wait_port(port, process, 30, "ggml-rpc-server")
            tunnels.expose(listen, port)
        except BaseException:
            _stop(process)
            raise
        return RpcRankSession(process, tunnels, spec)

    def _load_driver(
        self, build: RpcBuild, spec: RunnerSpec, tunnels: Tunnels, config: Any, progress: Callable[[int, int], None]
    ) -> RpcDriverSession:
        assert spec.model_path is not None, f"{spec.card.model_id} has no model file on this node"
        remotes = list(spec.group.hosts[1:]) if spec.group is not None else []
        deadline = spec.group.formation_deadline_s if spec.group is not None else 0
        for remote in remotes:  # every rank answers before the driver connects (llama.cpp aborts otherwise)
            tunnels.wait_reachable(remote, deadline)
        local = [f"127.0.0.1:{tunnels.reach(remote)}" for remote in remotes]
        shares = list(spec.group.layers) if spec.group is not None and spec.group.layers else _even_shares(spec)
        local_gpu = build.compute != "cpu" and not spec.shard.backend.endswith("-cpu")
        ngl, split = tensor_split(shares, local_gpu)
        server = RpcLlamaServer(
            build,
            local,
            ngl,
            split,
            model_path=spec.model_path,
            n_parallel=config.n_parallel,
            n_threads=config.n_threads,
            n_threads_batch=config.n_threads_batch,
            n_ctx=spec.context_limit or config.n_ctx,
            cache_type=spec.kv_cache_type,
            cache_ram_mib=config.cache_ram_mib,
            after_tool_result=config.after_tool_result,
            n_ubatch=config.n_ubatch,
            n_batch=config.n_batch,
            verbosity=config.verbosity,
        )
        progress(0, spec.card.n_layers)
        server.start()
        progress(spec.card.n_layers, spec.card.n_layers)
        gate = TokenGate(server.context_length, max_running=server.n_parallel)
        return RpcDriverSession(server, spec, f"{self.name}-{build.compute}", gate, tunnels)


def _even_shares(spec: RunnerSpec) -> list[tuple[int, int]]:
    """Without the other ranks' shares: rank 0's own span, the rest split evenly."""
    n, world = spec.card.n_layers, spec.shard.world_size
    shares = [(spec.shard.start_layer, spec.shard.end_layer)]
    rest = n - spec.shard.end_layer
    start = spec.shard.end_layer
    for i in range(1, world):
        count = rest // (world - 1) + (1 if i <= rest % (world - 1) else 0)
        shares.append((start, start + count))
        start += count
    return shares
