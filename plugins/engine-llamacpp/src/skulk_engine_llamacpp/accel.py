"""Which llama.cpp build is installed (CPU, CUDA, ROCm, Vulkan, Metal), which backend tag that makes on
this node's hardware, and how many layers a runner offloads.

Why from the package files and not from llama.cpp itself: the node process never loads llama.cpp (a
CUDA build would bring the CUDA runtime into the node, and the probe runs every heartbeat). A GPU
build says what it is without being loaded: llama-cpp-python ships ggml's backends as files
(``llama_cpp/lib/libggml-cuda.so``), xllamacpp links its backend's runtime (``libcudart.so.12``,
``libamdhip64.so``, ``libvulkan.so.1``; read from the ELF's DT_NEEDED entries, a few KiB of headers),
and the macOS wheels are Metal builds. Where the hardware plugin has also asked the build's own
device list (``facts["hardware"]["builds"]``, in a subprocess), a GPU compute it does not list is not
advertised: the runtime has the last word.

The tag is ``<engine>-<compute>`` for a GPU build on hardware it runs on (a CUDA build on a node whose
facts show an NVIDIA GPU -> ``llama_server-cuda``), listed before ``<engine>-cpu``; with no GPU build
or no such GPU the engine advertises ``<engine>-cpu`` alone, exactly as before.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import platform
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger("skulk.engine.llamacpp")

Compute = Literal["cpu", "cuda", "rocm", "vulkan", "metal"]
GPU_COMPUTES: tuple[Compute, ...] = ("cuda", "rocm", "vulkan", "metal")

#: file-name / shared-library markers of each GPU backend (lower case)
MARKERS: dict[Compute, tuple[str, ...]] = {
    "cuda": ("ggml-cuda", "libcudart", "libcublas", "libcuda.so"),
    "rocm": ("ggml-hip", "libamdhip64", "libhipblas", "librocblas"),
    "vulkan": ("ggml-vulkan", "libvulkan"),
    "metal": ("ggml-metal", "metal.framework"),
}
#: the GPU vendors each compute runs on (Vulkan: any discrete or integrated GPU but Apple's)
COMPUTE_VENDORS: dict[Compute, frozenset[str]] = {
    "cuda": frozenset({"nvidia"}),
    "rocm": frozenset({"amd"}),
    "metal": frozenset({"apple"}),
    "vulkan": frozenset({"nvidia", "amd", "intel", "other"}),
}


# ------------------------------------------------------------------------------ the build


def compute_from_names(names: Iterable[str], version: str = "", os_name: str = "", arch: str = "") -> Compute:
    """The GPU backend a build carries, from its files' names and the libraries they link.

    ``version``: a local label (``+cu128``, ``+rocm``, ``+vulkan``) counts too. On macOS arm64 every
    xllamacpp / llama-cpp-python wheel is a Metal build.
    """
    text = " ".join(n.lower() for n in names)
    label = version.partition("+")[2].lower()
    for compute in ("cuda", "rocm", "vulkan", "metal"):
        if any(m in text for m in MARKERS[compute]):
            return compute
    if label.startswith("cu"):
        return "cuda"
    if label.startswith(("rocm", "hip")):
        return "rocm"
    if label.startswith("vulkan"):
        return "vulkan"
    if os_name == "Darwin" and arch == "arm64":
        return "metal"
    return "cpu"


def elf_needed(path: Path) -> list[str]:
    """The DT_NEEDED libraries of a 64-bit little-endian ELF file ([] for anything else)."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return []
            (shoff,) = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
            out = []
            for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
                if kind != 6 or link >= len(sections):  # SHT_DYNAMIC
                    continue
                f.seek(offset)
                dynamic = f.read(size)
                strtab = sections[link]
                f.seek(strtab[4])
                strings = f.read(strtab[5])
                for i in range(0, len(dynamic) - 15, entsize or 16):
                    tag, value = struct.unpack_from("<qQ", dynamic, i)
                    if tag == 0:
                        break
                    if tag == 1 and value < len(strings):  # DT_NEEDED
                        out.append(strings[value : strings.index(b"\0", value)].decode(errors="replace"))
            return out
    except (OSError, struct.error, ValueError):
        return []


def package_names(dist: str, module: str) -> tuple[list[str], str]:
    """(names of the package's files and of the libraries its shared objects link, version)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return [], ""
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = ""
    names: list[str] = []
    roots = [Path(p) for p in spec.submodule_search_locations]
    roots += [r.parent / f"{module}.libs" for r in roots]  # auditwheel's bundled libraries
    for root in roots:
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            names.append(path.name)
            if ".so" in path.name or path.suffix in (".dylib", ".dll"):
                names += elf_needed(path)
    return names, version


@cache
def _detect(dist: str, module: str, key: tuple[Any, ...]) -> Compute:
    names, version = package_names(dist, module)
    return compute_from_names(names, version, platform.system(), platform.machine())


def detect_build(dist: str, module: str) -> Compute:
    """The installed build's compute, cached until the package changes (an install replaces it)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return "cpu"
    try:
        stat = Path(spec.origin).parent.stat()
        key: tuple[Any, ...] = (spec.origin, stat.st_mtime_ns)
    except OSError:
        key = (spec.origin,)
    return _detect(dist, module, key)


# ------------------------------------------------------------------------------ the tag


def _host_vendors() -> set[str]:
    """Without the hardware plugin's facts: the cheap signs of a GPU on this host."""
    vendors = set()
    if Path("/proc/driver/nvidia/version").exists():
        vendors.add("nvidia")
    if Path("/dev/kfd").exists():
        vendors.add("amd")
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        vendors.add("apple")
    return vendors


def gpu_vendors(facts: Mapping[str, Any]) -> set[str]:
    """The GPU vendors in this node's facts (the hardware plugin's ``gpus``); without that key, the host's."""
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        return _host_vendors()
    return {str(g.get("vendor")) for g in gpus if isinstance(g, dict)}


def runtime_computes(facts: Mapping[str, Any], engine: str) -> set[str] | None:
    """What the build's own device list showed (the hardware plugin asks it), None when not asked."""
    hardware = facts.get("hardware")
    if not isinstance(hardware, dict):
        return None
    for build in hardware.get("builds") or ():
        if isinstance(build, dict) and build.get("engine") == engine:
            return {str(c) for c in build.get("computes") or ()}
    return None


def choose_compute(build: Compute, facts: Mapping[str, Any], engine: str = "") -> Compute:
    """The compute to advertise: the build's GPU backend where the node has a GPU it runs on, else cpu."""
    if build == "cpu" or not (gpu_vendors(facts) & COMPUTE_VENDORS[build]):
        return "cpu"
    runtime = runtime_computes(facts, engine) if engine == "llama_server" else None
    if runtime is not None and build not in runtime:
        # the build's own device list had no such device (driver missing or too old)
        log.debug("%s: a %s build, but its device list shows %s: advertising cpu", engine, build, sorted(runtime))
        return "cpu"
    return build


def backend_tags(engine: str, build: Compute, facts: Mapping[str, Any]) -> list[str]:
    compute = choose_compute(build, facts, engine)
    return [f"{engine}-cpu"] if compute == "cpu" else [f"{engine}-{compute}", f"{engine}-cpu"]


# ------------------------------------------------------------------------------ offload

#: VRAM kept free for llama.cpp's compute buffers and the CUDA/HIP context
VRAM_RESERVE_BYTES = 768 * 2**20


@dataclass(frozen=True)
class OffloadPlan:
    """``n_gpu_layers`` for llama.cpp (``layers`` of ``total``; ``total`` = repeating layers + output)."""

    layers: int
    total: int
    reason: str

    @property
    def full(self) -> bool:
        return self.layers >= self.total

    def summary(self) -> str:
        return f"offloading {self.layers}/{self.total} layers to the GPU: {self.reason}"


#: bytes per K/V element of each cache type (ggml's q8_0: 34 bytes per 32, q4_0: 18 per 32)
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def layer_bytes(card: Any, n_ctx: int | None = None, kv_cache_type: str = "f16") -> int:
    """One layer's VRAM by the card: its share of the weights plus its K and V for ``n_ctx`` tokens."""
    n_layers = max(1, int(card.n_layers))
    weights = int(card.storage_size) // n_layers
    head_dim = int((card.sections.get("runtime") or {}).get("head_dim") or 0)
    kv_heads = int(card.num_key_value_heads or 0)
    ctx = int(n_ctx or card.context_length or 0)
    return weights + int(2 * ctx * kv_heads * head_dim * KV_BYTES.get(kv_cache_type, 2.0))


def plan_offload(
    requested: int | Literal["auto"],
    n_layers: int,
    per_layer: int,
    vram_free: int | None,
    reserve: int = VRAM_RESERVE_BYTES,
) -> OffloadPlan:
    """How many of ``n_layers`` (+1 for the output layer) go to the GPU.

    ``auto``: all of them when ``vram_free`` holds them and the reserve, else the layers that fit
    (``per_layer`` each; the output layer stays on the CPU then). An int from the config is taken as
    given (capped at all). ``vram_free`` None: the build sees no GPU device, nothing is offloaded.
    """
    total = n_layers + 1
    if requested != "auto":
        layers = min(int(requested), total)
        return OffloadPlan(layers, total, f"n_gpu_layers = {requested} in [plugins.engine-llamacpp]")
    if vram_free is None:
        return OffloadPlan(0, total, "this llama.cpp build sees no GPU device")
    need = total * per_layer + reserve
    if vram_free >= need:
        return OffloadPlan(total, total, f"{_mib(vram_free)} VRAM free holds all ({_mib(need)} with the reserve)")
    fits = max(0, (vram_free - reserve) // max(1, per_layer))
    layers = min(int(fits), n_layers)
    return OffloadPlan(
        layers,
        total,
        f"VRAM short: {_mib(vram_free)} free, all {total} layers need {_mib(need)} "
        f"({_mib(per_layer)} per layer + {_mib(reserve)} reserve); the rest run on the CPU",
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def gpu_free_bytes(devices: Iterable[Mapping[str, Any]], gpu_types: Iterable[Any]) -> int | None:
    """Free memory of the GPU devices in ggml's device list (``xllamacpp.get_device_info()``), None if none."""
    kinds = set(gpu_types)
    gpus = [d for d in devices if d.get("type") in kinds]
    if not gpus:
        return None
    return sum(int(d.get("memory_free") or 0) for d in gpus)
