"""The vLLM engine: one managed ``vllm`` OpenAI server per runner, proxied like any OpenAI server.

What the runner starts, and why each choice:

* ``python -m vllm.entrypoints.openai.api_server`` from the vLLM venv (the ``vllm`` console script
  looks for a distribution named ``vllm``, which the CPU build is not);
* ``--max-model-len`` = the placement's context (``context_tokens``; by default at most 32,768), so a
  128k-context card does not reserve a KV cache no small node has;
* on CUDA, ``--gpu-memory-utilization`` = the placement's reservation (weights x overhead + KV
  for the capped context + floor, the planner's own formula) over the GPU's total memory, so
  two instances on one GPU do not each grab vLLM's default 90 %;
* on CPU, FACTS.md's workarounds: ``--dtype float32`` (bfloat16 gives garbage on these CPUs),
  ``--enforce-eager``, ``VLLM_HOST_IP=127.0.0.1``, ``VLLM_CPU_KVCACHE_SPACE`` (GiB, from the same
  reservation, at least 1) and ``VLLM_CPU_OMP_THREADS_BIND=nobind``;
* the model family's tool parser (``--enable-auto-tool-choice --tool-call-parser``), from the
  card's ``[tooling] tool_parser`` or the family table below.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skulk_kernel.api import EngineProbe, ModelCard, RunnerSpec, Sharding

from .managed import ManagedServer, ServerSpec, free_port
from .plugin import VllmConfig, vllm_config
from .proxy import OpenAIServerSession, VllmCounter
from .venv import Flavor, detect_flavor, installed_info, venv_python

log = logging.getLogger("skulk.engine_vllm")

MAX_CONTEXT = 32_768
GiB = 1024**3
MiB = 1024**2
#: The planner's admission arithmetic (plugins/master planner.py, MemoryPlanner defaults).
OVERHEAD = 1.25
FLOOR_BYTES = 256 * MiB
#: vLLM's tool-call parser per model family (vLLM's own parser names).
TOOL_PARSERS = {
    "llama": "llama3_json",
    "qwen2": "hermes",
    "qwen3": "hermes",
    "mistral": "mistral",
    "granite": "granite",
    "internlm2": "internlm",
    "phi3": "phi4_mini_json",
}
RUN_DIR_ENV = "SKULK_VLLM_RUN_DIR"


def run_dir() -> Path:
    """Where pid files live: the node's data dir (the plugin's `configure` exports it to runners)."""
    if configured := os.environ.get(RUN_DIR_ENV):
        return Path(configured)
    return Path(os.environ.get("SKULK_HOME", "~/.skulk")).expanduser() / "engine-vllm"


def capped_context(card: ModelCard, cap: int = MAX_CONTEXT) -> int:
    return max(1, min(card.context_length, cap))


def kv_bytes(card: ModelCard, context: int) -> int:
    """fp16 K and V for every layer at `context` tokens (the planner's admission figure)."""
    head_dim = int(card.sections.get("runtime", {}).get("head_dim", 64))
    return 2 * card.n_layers * context * card.num_key_value_heads * head_dim * 2


def reservation_bytes(card: ModelCard, share: float = 1.0, cap: int = MAX_CONTEXT) -> int:
    """What placement admitted for this shard: weights x overhead + KV + floor."""
    return int(card.storage_size * share * OVERHEAD + kv_bytes(card, capped_context(card, cap)) * share + FLOOR_BYTES)


def gpu_memory_fraction(reserved: int, vram_total: int) -> float:
    """vLLM's --gpu-memory-utilization for a reservation, kept inside [0.05, 0.95]."""
    if vram_total <= 0:
        return 0.9
    return round(min(0.95, max(0.05, reserved / vram_total)), 3)


def cpu_kvcache_gib(card: ModelCard, cap: int = MAX_CONTEXT) -> int:
    return max(1, math.ceil(kv_bytes(card, capped_context(card, cap)) / GiB))


def tool_parser(card: ModelCard) -> str | None:
    configured = card.sections.get("tooling", {}).get("tool_parser")
    if isinstance(configured, str):
        return configured or None
    return TOOL_PARSERS.get(card.family)


def first_gpu_total_bytes() -> int | None:
    """Total memory of the first visible NVIDIA GPU, through NVML (None without one)."""
    try:
        import pynvml  # nvidia-ml-py: imported only here
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def flavor_of(backend: str) -> Flavor:
    return "cuda" if backend.endswith("-cuda") else "cpu"


def server_command(
    python: Path,
    folder: Path,
    card: ModelCard,
    flavor: Flavor,
    port: int,
    options: VllmConfig | dict[str, Any],
    context: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one vLLM server (pure: unit-tested without vLLM).

    `context`: the placement's context (RunnerSpec.context_limit), what its KV was admitted for;
    without one, the card's capped at ``max_context``.
    """
    config = vllm_config(options)
    cap = context or config.max_context
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(folder),
        "--served-model-name", card.model_id,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(capped_context(card, cap)),
        "--max-num-seqs", str(config.max_num_seqs),
        "--generation-config", "vllm",  # the card's sampling defaults, not the folder's
    ]  # fmt: skip
    env = {
        "VLLM_HOST_IP": "127.0.0.1",  # else its internal sockets bind the LAN address
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if flavor == "cpu":
        argv += ["--dtype", "float32", "--enforce-eager"]
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib or cpu_kvcache_gib(card, cap))
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    else:
        total = config.vram_total_bytes or first_gpu_total_bytes()
        fraction = gpu_memory_fraction(reservation_bytes(card, cap=cap), int(total or 0))
        argv += ["--gpu-memory-utilization", str(fraction)]
        if config.enforce_eager:
            argv.append("--enforce-eager")
    if (parser := config.tool_parser or tool_parser(card)) and "tools" in card.capabilities:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", str(parser)]
    argv += config.extra_args
    return argv, env


def teardown_on_sigterm(server: ManagedServer) -> None:
    """A runner SIGTERMed with its node's process group (systemd, ``kill -- -PGID``) stops its server first.

    Why: the server runs in its own session, so the group signal never reaches it; without this the
    runner dies at once, the server follows only through PR_SET_PDEATHSIG and the pid file stays
    behind. Called from the runner's main thread (signal handlers can only be set there); the
    previous disposition is restored and the signal re-delivered, so the runner still exits.
    """
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        try:
            server.stop()
        finally:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    with contextlib.suppress(ValueError):  # not the main thread: leave the default
        signal.signal(signal.SIGTERM, handler)


class VllmEngine:
    name = "vllm"
    tasks = frozenset({"TextGeneration"})
    dispatch_width = 8  # vLLM batches continuously; the runner admits this many at once
    splits: frozenset[Sharding] = frozenset()  # whole models (vLLM's own TP stays inside one node)

    def probe(self) -> EngineProbe:
        flavor = detect_flavor()
        info = installed_info(flavor)
        if info is None:
            return EngineProbe(
                available=False,
                reason=f"the vLLM {flavor} venv is not installed: run `skulk-kernel engines install vllm`",
            )
        return EngineProbe(available=True, version=f"vllm {info.get('vllm', '?')} ({flavor})")

    def backend_tags(self, facts: dict[str, Any]) -> list[str]:
        tags = []
        nvidia = any(g.get("vendor") == "nvidia" for g in facts.get("gpus", ()) if isinstance(g, dict))
        if installed_info("cuda") is not None and (nvidia or detect_flavor() == "cuda"):
            tags.append("vllm-cuda")
        if installed_info("cpu") is not None:
            tags.append("vllm-cpu")
        return tags

    def load(self, spec: RunnerSpec, progress: Callable[[int, int], None]) -> OpenAIServerSession:
        card = spec.card
        flavor = flavor_of(spec.shard.backend)
        python = venv_python(flavor)
        if python is None:
            raise RuntimeError(f"the vLLM {flavor} venv is not installed: run `skulk-kernel engines install vllm`")
        if spec.model_path is None:
            raise RuntimeError(f"{card.model_id} has no model folder on this node")
        folder = spec.model_path if spec.model_path.is_dir() else spec.model_path.parent
        port = free_port()
        config = vllm_config(spec.options)
        argv, env = server_command(python, folder, card, flavor, port, config, spec.context_limit)
        where = run_dir()
        where.mkdir(parents=True, exist_ok=True)
        server = ManagedServer(
            ServerSpec(
                name="vLLM",
                argv=argv,
                env=env,
                port=port,
                run_dir=where,
                key=spec.runner_id,
                labels={"instance_id": spec.instance_id, "runner_id": spec.runner_id, "model_id": card.model_id},
                log_path=where / f"{spec.runner_id}.log",
                ready_timeout_s=config.ready_timeout_s,
                stop_grace_s=2.5,  # inside the worker's 5 s join of a stopping runner
            )
        )
        progress(0, card.n_layers)
        log.info("starting vLLM for %s: %s", card.model_id, " ".join(argv[1:]))
        server.start()
        teardown_on_sigterm(server)
        progress(card.n_layers, card.n_layers)
        return OpenAIServerSession(
            server.base_url,
            card.model_id,
            tag=spec.shard.backend,
            engine_label="vLLM",
            counter=VllmCounter(),
            alive=lambda: server.exit_reason,
            close=server.stop,
        )
