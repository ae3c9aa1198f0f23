"""Reading the hardware: NVML (NVIDIA), sysfs (AMD), system_profiler (Apple), the engines' device lists.

Every reader takes its source as an argument (an NVML module, a sysfs root, profiler JSON, a
device list) so the tests replay recorded answers from real machines; the defaults read this
machine. A source that is absent or fails means "none of that vendor here", and the failure is
kept in ``NodeHardware.errors`` so the doctor can say why.
"""

from __future__ import annotations

import importlib
import json
import platform
import subprocess
import sys
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

from .facts import EngineBuild, GpuFacts, NodeHardware

# ------------------------------------------------------------------------------ NVIDIA (NVML)


def _nvml_or_none(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # NVMLError_NotSupported and friends: the reading is unknown, not zero
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(nvml: Any = None) -> tuple[list[GpuFacts], str | None, str | None]:
    """(GPUs, driver version, highest CUDA version the driver supports) from NVML.

    `nvml` is the ``pynvml`` module (nvidia-ml-py) or anything with its functions; None imports
    it lazily. Raises when NVML cannot start (no driver, no library): the caller records why.
    """
    if nvml is None:
        nvml = importlib.import_module("pynvml")  # nvidia-ml-py; loads libnvidia-ml.so only in nvmlInit
    nvml.nvmlInit()
    try:
        driver = _nvml_or_none(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda_raw = _nvml_or_none(nvml.nvmlSystemGetCudaDriverVersion)
        cuda = f"{int(cuda_raw) // 1000}.{int(cuda_raw) % 1000 // 10}" if cuda_raw else None
        gpus = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = _nvml_or_none(partial(lambda h: nvml.nvmlDeviceGetMemoryInfo(h), h))
            util = _nvml_or_none(partial(lambda h: nvml.nvmlDeviceGetUtilizationRates(h), h))
            temp = _nvml_or_none(partial(lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU), h))
            power_mw = _nvml_or_none(partial(lambda h: nvml.nvmlDeviceGetPowerUsage(h), h))
            cc = _nvml_or_none(partial(lambda h: nvml.nvmlDeviceGetCudaComputeCapability(h), h))
            pci = _nvml_or_none(partial(lambda h: nvml.nvmlDeviceGetPciInfo(h), h))
            gpus.append(
                GpuFacts(
                    index=index,
                    vendor="nvidia",
                    model=_text(nvml.nvmlDeviceGetName(h)),
                    source="nvml",
                    vram_total_bytes=int(mem.total) if mem is not None else None,
                    vram_free_bytes=int(mem.free) if mem is not None else None,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    temperature_c=float(temp) if temp is not None else None,
                    power_w=round(power_mw / 1000.0, 1) if power_mw is not None else None,
                    compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                    pci_bus_id=_text(pci.busId) if pci is not None else None,
                )
            )
        return gpus, driver, cuda
    finally:
        _nvml_or_none(nvml.nvmlShutdown)


# ------------------------------------------------------------------------------ AMD (sysfs)

AMD_VENDOR = "0x1002"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def read_amd_sysfs(root: Path = Path("/")) -> list[GpuFacts]:
    """AMD GPUs from ``<root>/sys/class/drm/card*/device`` (amdgpu's files; root injectable)."""
    drm = root / "sys" / "class" / "drm"
    gpus: list[GpuFacts] = []
    cards = sorted((p for p in drm.glob("card*") if p.name[4:].isdigit()), key=lambda p: int(p.name[4:]))
    for card in cards:
        dev = card / "device"
        if _read(dev / "vendor") != AMD_VENDOR:
            continue
        total = _int(dev / "mem_info_vram_total")
        used = _int(dev / "mem_info_vram_used")
        hwmon = next(iter(sorted((dev / "hwmon").glob("hwmon*"))), None)
        temp = _int(hwmon / "temp1_input") if hwmon else None
        power = (_int(hwmon / "power1_average") or _int(hwmon / "power1_input")) if hwmon else None
        busy = _int(dev / "gpu_busy_percent")
        name = _read(dev / "product_name") or f"AMD GPU {_read(dev / 'device') or '?'}"
        gpus.append(
            GpuFacts(
                index=len(gpus),
                vendor="amd",
                model=name,
                source="sysfs",
                vram_total_bytes=total,
                vram_free_bytes=total - used if total is not None and used is not None else None,
                utilization_pct=float(busy) if busy is not None else None,
                temperature_c=temp / 1000.0 if temp is not None else None,
                power_w=round(power / 1e6, 1) if power is not None else None,
                pci_bus_id=dev.resolve().name if dev.exists() else None,
            )
        )
    return gpus


# ------------------------------------------------------------------------------ Apple (system_profiler)


def read_system_profiler(profiler_json: str) -> tuple[list[GpuFacts], str | None]:
    """(GPUs, chip) from ``system_profiler SPDisplaysDataType SPHardwareDataType -json``."""
    data = json.loads(profiler_json)
    hardware = (data.get("SPHardwareDataType") or [{}])[0]
    chip = hardware.get("chip_type") or hardware.get("cpu_type")
    gpus: list[GpuFacts] = []
    for entry in data.get("SPDisplaysDataType") or ():
        vendor_raw = str(entry.get("spdisplays_vendor", "")).lower()
        model = str(entry.get("sppci_model") or entry.get("_name") or "GPU")
        apple = "apple" in vendor_raw or model.startswith("Apple")
        metal = str(entry.get("spdisplays_mtlgpufamilysupport") or entry.get("spdisplays_metal") or "")
        gpus.append(
            GpuFacts(
                index=len(gpus),
                vendor="apple" if apple else "amd" if "amd" in vendor_raw or "ati" in vendor_raw else "other",
                model=f"{model} ({entry['sppci_cores']} cores)" if entry.get("sppci_cores") else model,
                source="system_profiler",
                unified_memory=apple,
                compute_capability=metal.replace("spdisplays_", "") or None,
            )
        )
    return gpus, str(chip) if chip else None


@cache
def _system_profiler() -> str:
    return subprocess.run(
        ["system_profiler", "SPDisplaysDataType", "SPHardwareDataType", "-json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout


# ------------------------------------------------------------------------------ the engines' own lists


#: ggml's device names: CUDA0, ROCm0, Vulkan0, MTL0 (older builds: Metal)
LLAMA_DEVICE_NEEDLES = (
    ("cuda", "cuda"),
    ("rocm", "rocm"),
    ("hip", "rocm"),
    ("metal", "metal"),
    ("mtl", "metal"),
    ("vulkan", "vulkan"),
)


def llama_computes(devices: list[dict[str, Any]]) -> tuple[str, ...]:
    """What a llama.cpp build can run on, from ggml's device list (``xllamacpp.get_device_info()``)."""
    found = ["cpu"]
    for dev in devices:
        label = f"{dev.get('name', '')} {dev.get('description', '')}".lower()
        for needle, compute in LLAMA_DEVICE_NEEDLES:
            if needle in label and compute not in found:
                found.append(compute)
    return tuple(found)


@cache
def xllamacpp_devices() -> tuple[dict[str, Any], ...]:
    """ggml's device list, asked in a subprocess (never load llama.cpp, or CUDA, into the node)."""
    code = (
        "import json, xllamacpp as x; "
        "print(json.dumps([{'name': d['name'], 'description': d['description']} for d in x.get_device_info()]))"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        return tuple(json.loads(out.stdout.strip().splitlines()[-1]))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return ()


def engine_builds(
    builds: dict[str, str], os_name: str, arch: str, llama_devices: list[dict[str, Any]]
) -> list[EngineBuild]:
    """Engine builds from the engines' own ``facts["engine_builds"]`` and their device lists."""
    out = []
    for key, build in sorted(builds.items()):
        if build.startswith("unusable"):
            continue
        if key == "llama_server":
            out.append(EngineBuild(engine="llama_server", build=build, computes=llama_computes(llama_devices)))
        elif key == "llama_cpp":
            out.append(EngineBuild(engine="llama_cpp", build=build, computes=("cpu",)))
        elif key.startswith("vllm-"):
            out.append(EngineBuild(engine="vllm", build=build, computes=(key.removeprefix("vllm-"),)))
        elif key == "mlx":
            metal = os_name == "Darwin" and arch == "arm64"
            out.append(EngineBuild(engine="mlx", build=build, computes=("metal",) if metal else ("cpu",)))
    return out


# ------------------------------------------------------------------------------ all of it


def probe_hardware(
    builds: dict[str, str],
    *,
    nvml: Any = None,
    sysfs_root: Path = Path("/"),
    profiler_json: str | None = None,
    llama_devices: list[dict[str, Any]] | None = None,
    os_name: str | None = None,
    arch: str | None = None,
) -> NodeHardware:
    """This node's hardware. Every source is injectable; the defaults read the real machine."""
    os_name = os_name or platform.system()
    arch = arch or platform.machine()
    errors: dict[str, str] = {}
    gpus: list[GpuFacts] = []
    driver = cuda = chip = None
    try:
        gpus, driver, cuda = read_nvml(nvml)
    except Exception as exc:
        errors["nvml"] = f"{type(exc).__name__}: {exc}"
    if os_name == "Linux":
        gpus += [g.model_copy(update={"index": len(gpus) + i}) for i, g in enumerate(read_amd_sysfs(sysfs_root))]
    if os_name == "Darwin":
        try:
            text = profiler_json if profiler_json is not None else _system_profiler()
            apple, chip = read_system_profiler(text)
            gpus += [g.model_copy(update={"index": len(gpus) + i}) for i, g in enumerate(apple)]
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            errors["system_profiler"] = f"{type(exc).__name__}: {exc}"
    if llama_devices is None:
        llama_devices = list(xllamacpp_devices()) if "llama_server" in builds else []
    return NodeHardware(
        os=os_name,
        arch=arch,
        gpus=tuple(gpus),
        nvidia_driver=driver,
        nvidia_cuda_driver=cuda,
        apple_chip=chip,
        builds=tuple(engine_builds(builds, os_name, arch, llama_devices)),
        errors=errors,
    )
