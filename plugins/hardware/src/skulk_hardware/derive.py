"""Pure functions from hardware facts to backend tags and to conflicts (code -> what to do).

Why pure: placement matches on these tags, so they must follow from the facts alone, testable
from recorded facts of machines we do not have. Detection creates capability; an operator's
override can narrow it but never invent hardware: an override that names a compute the facts
do not show is a conflict, reported loudly in node health.
"""

from __future__ import annotations

from .facts import NodeHardware

#: Lowest compute capability each engine's CUDA build runs on (vLLM: Volta and newer).
MIN_COMPUTE_CAPABILITY = {"vllm": (7, 0), "llama_server": (5, 0)}
#: Highest-CUDA-version-the-driver-supports that each engine's CUDA build needs (vLLM 0.33's
#: wheels are built against CUDA 12.8; an older driver fails at the first kernel launch).
MIN_CUDA_DRIVER = {"vllm": (12, 8), "llama_server": (12, 0)}
#: The hardware each compute needs.
COMPUTE_VENDOR = {"cuda": "nvidia", "rocm": "amd", "metal": "apple"}


def _version(text: str | None) -> tuple[int, int]:
    try:
        major, _, minor = (text or "0.0").partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return (0, 0)


def compute_available(hw: NodeHardware, compute: str, engine: str = "") -> bool:
    """Does this node's hardware support `compute` (for `engine`'s minimum compute capability)?"""
    if compute == "cpu":
        return True
    vendor = COMPUTE_VENDOR.get(compute)
    if compute == "vulkan":  # any GPU but Apple's (Apple silicon has no Vulkan driver)
        return any(g.vendor != "apple" for g in hw.gpus)
    gpus = [g for g in hw.gpus if g.vendor == vendor]
    if compute == "cuda" and engine in MIN_COMPUTE_CAPABILITY:
        floor = MIN_COMPUTE_CAPABILITY[engine]
        gpus = [g for g in gpus if g.compute_capability is None or _version(g.compute_capability) >= floor]
    return bool(gpus)


def derive_backends(hw: NodeHardware) -> list[str]:
    """Every `<engine>-<compute>` tag this node can serve: an installed build x hardware for it."""
    tags = []
    for build in hw.builds:
        for compute in build.computes:
            tag = f"{build.engine}-{compute}"
            if compute_available(hw, compute, build.engine) and tag not in tags:
                tags.append(tag)
    return tags


def find_conflicts(hw: NodeHardware, override: tuple[str, ...] | None = None) -> dict[str, str]:
    """Conditions an operator should fix, each with its remediation."""
    out: dict[str, str] = {}
    computes = {c for b in hw.builds for c in b.computes}
    nvidia = [g for g in hw.gpus if g.vendor == "nvidia"]
    if nvidia and "cuda" not in computes:
        out["gpu_without_gpu_build"] = (
            f"{len(nvidia)} NVIDIA GPU(s) ({nvidia[0].model}) but only CPU engine builds are installed: "
            "run `skulk-kernel engines install llamacpp-cuda` (llama.cpp) or "
            "`skulk-kernel engines install vllm --flavor cuda`, and restart the node"
        )
    amd = [g for g in hw.gpus if g.vendor == "amd" and g.source == "sysfs"]
    if amd and "rocm" not in computes:
        out["amd_gpu_without_rocm_build"] = (
            f"an AMD GPU ({amd[0].model}) but no ROCm engine build: run "
            "`skulk-kernel engines install llamacpp-rocm` (llama.cpp) or install a ROCm vLLM to use it; "
            "until then models run on the CPU"
        )
    apple = [g for g in hw.gpus if g.vendor == "apple"]
    if apple and "metal" not in computes:
        out["apple_gpu_without_mlx"] = (
            f"Apple silicon ({hw.apple_chip or apple[0].model}) but no Metal engine: "
            "pip install -e plugins/engine-mlx (mlx, mlx-lm) and use the mac-mlx profile"
        )
    if nvidia and hw.nvidia_cuda_driver is not None:
        for build in hw.builds:
            need = MIN_CUDA_DRIVER.get(build.engine)
            if "cuda" in build.computes and need and _version(hw.nvidia_cuda_driver) < need:
                out["driver_too_old"] = (
                    f"the NVIDIA driver {hw.nvidia_driver or '?'} supports CUDA {hw.nvidia_cuda_driver}, but "
                    f"{build.build} needs CUDA {need[0]}.{need[1]}: upgrade the NVIDIA driver and reboot"
                )
    if any("vllm" == b.engine and "cuda" in b.computes for b in hw.builds):
        floor = MIN_COMPUTE_CAPABILITY["vllm"]
        old = [g for g in nvidia if g.compute_capability and _version(g.compute_capability) < floor]
        if old:
            out["compute_capability_too_old"] = (
                f"{old[0].model} has compute capability {old[0].compute_capability}; vLLM needs "
                f"{floor[0]}.{floor[1]} or newer: use llama.cpp on this GPU, or a newer GPU"
            )
    if override:
        have = derive_backends(hw)
        bad = []
        for tag in override:
            engine, _, compute = tag.rpartition("-")
            if not compute_available(hw, compute, engine):
                bad.append(f"{tag} (no {COMPUTE_VENDOR.get(compute, compute)} GPU detected)")
            elif tag not in have:
                bad.append(f"{tag} (no {engine} build for {compute} is installed)")
        if bad:
            out["override_contradicts_hardware"] = (
                f"[plugins.hardware] backends names {', '.join(bad)}; detected: {have or 'none'}. "
                "Remove those tags from the profile, or install what they need"
            )
    return out
