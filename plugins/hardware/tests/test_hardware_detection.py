"""Detection from recorded facts: no GPU, one NVIDIA, two mixed NVIDIA, AMD, Apple."""

from __future__ import annotations

from pathlib import Path

import pytest
from recorded import DATA, RecordedNvml
from skulk_hardware.derive import derive_backends, find_conflicts
from skulk_hardware.detect import llama_computes, probe_hardware, read_amd_sysfs, read_system_profiler
from skulk_hardware.facts import NodeHardware

EMPTY_SYSFS = DATA / "no-such-root"
XLLAMACPP_CPU = {"llama_server": "xllamacpp 2026.10.11549"}
CPU_DEVICES = [{"name": "CPU", "description": "AMD EPYC"}]
CUDA_DEVICES = [*CPU_DEVICES, {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4090"}]


def linux(nvml: str, builds: dict[str, str], devices: list[dict[str, str]] = CPU_DEVICES, root: Path = EMPTY_SYSFS):
    return probe_hardware(
        builds, nvml=RecordedNvml(nvml), sysfs_root=root, llama_devices=devices, os_name="Linux", arch="x86_64"
    )


def test_no_gpu_is_a_cpu_node_with_the_reason_kept() -> None:
    hw = linux("nvml-none.json", {**XLLAMACPP_CPU, "vllm-cpu": "vllm 0.32.0"})
    assert hw.gpus == ()
    assert "NVML Shared Library Not Found" in hw.errors["nvml"]
    assert derive_backends(hw) == ["llama_server-cpu", "vllm-cpu"]
    assert find_conflicts(hw) == {}


def test_one_nvidia_gpu_every_reading() -> None:
    nvml = RecordedNvml("nvml-one-4090.json")
    hw = probe_hardware(
        XLLAMACPP_CPU, nvml=nvml, sysfs_root=EMPTY_SYSFS, llama_devices=CPU_DEVICES, os_name="Linux", arch="x86_64"
    )
    assert nvml.initialised == 0  # shut down again
    (gpu,) = hw.gpus
    assert gpu.model == "NVIDIA GeForce RTX 4090" and gpu.vendor == "nvidia" and gpu.source == "nvml"
    assert gpu.vram_total_bytes == 25757220864 and gpu.vram_free_bytes == 25191907328
    assert (gpu.utilization_pct, gpu.temperature_c, gpu.power_w) == (3.0, 41.0, 28.7)
    assert gpu.compute_capability == "8.9" and gpu.pci_bus_id == "00000000:01:00.0"
    assert (hw.nvidia_driver, hw.nvidia_cuda_driver) == ("550.54.14", "12.4")


def test_one_nvidia_with_only_cpu_builds_is_a_conflict_with_a_remedy() -> None:
    hw = linux("nvml-one-4090.json", XLLAMACPP_CPU)
    assert derive_backends(hw) == ["llama_server-cpu"]
    conflicts = find_conflicts(hw)
    assert "gpu_without_gpu_build" in conflicts
    assert "skulk-kernel engines install vllm --flavor cuda" in conflicts["gpu_without_gpu_build"]
    assert "skulk-kernel engines install llamacpp-cuda" in conflicts["gpu_without_gpu_build"]


def test_one_nvidia_with_gpu_builds_derives_cuda_tags() -> None:
    hw = linux("nvml-one-4090.json", {**XLLAMACPP_CPU, "vllm-cuda": "vllm 0.33.0"}, CUDA_DEVICES)
    assert derive_backends(hw) == ["llama_server-cpu", "llama_server-cuda", "vllm-cuda"]
    # driver 550 supports CUDA 12.4, vLLM 0.33's wheels need 12.8
    assert "driver_too_old" in find_conflicts(hw)
    assert "upgrade the NVIDIA driver" in find_conflicts(hw)["driver_too_old"]


def test_two_mixed_nvidia_gpus() -> None:
    hw = linux("nvml-two-mixed.json", {**XLLAMACPP_CPU, "vllm-cuda": "vllm 0.33.0"}, CUDA_DEVICES)
    assert [g.model for g in hw.gpus] == ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce GTX 1080 Ti"]
    assert [g.compute_capability for g in hw.gpus] == ["8.6", "6.1"]
    assert hw.gpus[1].power_w is None  # NVML: Not Supported stays unknown, never 0
    assert hw.vram_total() == 25769803776 + 11811160064
    assert "vllm-cuda" in derive_backends(hw)  # the 3090 runs vLLM
    conflicts = find_conflicts(hw)
    assert "GTX 1080 Ti has compute capability 6.1" in conflicts["compute_capability_too_old"]


def test_only_an_old_nvidia_gpu_gets_no_vllm_cuda_tag() -> None:
    hw = NodeHardware.model_validate(
        linux("nvml-two-mixed.json", {"vllm-cuda": "vllm 0.33.0"}).model_dump()
        | {"gpus": [linux("nvml-two-mixed.json", {}).gpus[1].model_dump()]}
    )
    assert derive_backends(hw) == []


def test_amd_from_sysfs() -> None:
    root = DATA / "amd-7900xtx"
    (gpu,) = read_amd_sysfs(root)  # the Intel iGPU (card0) and the connector (card1-DP-1) are skipped
    assert gpu.vendor == "amd" and gpu.model == "AMD GPU 0x744c"
    assert gpu.vram_total_bytes == 25753026560 and gpu.vram_free_bytes == 25753026560 - 1073741824
    assert (gpu.utilization_pct, gpu.temperature_c, gpu.power_w) == (7.0, 45.0, 32.0)
    hw = linux("nvml-none.json", XLLAMACPP_CPU, root=root)
    assert derive_backends(hw) == ["llama_server-cpu"]
    assert "amd_gpu_without_rocm_build" in find_conflicts(hw)


def test_apple_from_system_profiler() -> None:
    text = (DATA / "apple-m2max.json").read_text()
    gpus, chip = read_system_profiler(text)
    assert chip == "Apple M2 Max"
    (gpu,) = gpus
    assert gpu.vendor == "apple" and gpu.unified_memory and gpu.vram_total_bytes is None
    assert gpu.model == "Apple M2 Max (38 cores)" and gpu.compute_capability == "metal3"
    hw = probe_hardware(
        {"mlx": "mlx 0.32.1", **XLLAMACPP_CPU},
        nvml=RecordedNvml("nvml-none.json"),
        profiler_json=text,
        llama_devices=[*CPU_DEVICES, {"name": "Metal", "description": "Apple M2 Max"}],
        os_name="Darwin",
        arch="arm64",
    )
    assert hw.apple_chip == "Apple M2 Max"
    assert derive_backends(hw) == ["llama_server-cpu", "llama_server-metal", "mlx-metal"]
    assert find_conflicts(hw) == {}
    cpu_llama = tuple(b.model_copy(update={"computes": ("cpu",)}) for b in hw.builds if b.engine != "mlx")
    assert (
        "pip install -e plugins/engine-mlx"
        in find_conflicts(hw.model_copy(update={"builds": cpu_llama}))["apple_gpu_without_mlx"]
    )


def test_an_override_that_contradicts_the_hardware() -> None:
    hw = linux("nvml-none.json", XLLAMACPP_CPU)
    conflicts = find_conflicts(hw, ("llama_server-cpu", "vllm-cuda"))
    message = conflicts["override_contradicts_hardware"]
    assert "vllm-cuda (no nvidia GPU detected)" in message and "llama_server-cpu" not in message.split(";")[0]
    assert find_conflicts(hw, ("llama_server-cpu",)) == {}
    gpu = linux("nvml-one-4090.json", XLLAMACPP_CPU)
    assert "no vllm build for cuda" in find_conflicts(gpu, ("vllm-cuda",))["override_contradicts_hardware"]


@pytest.mark.parametrize(
    ("devices", "computes"),
    [
        (CPU_DEVICES, ("cpu",)),
        (CUDA_DEVICES, ("cpu", "cuda")),
        ([*CPU_DEVICES, {"name": "ROCm0", "description": "Radeon RX 7900 XTX"}], ("cpu", "rocm")),
        ([*CPU_DEVICES, {"name": "MTL0", "description": "Apple M2 Max"}], ("cpu", "metal")),
        ([*CPU_DEVICES, {"name": "Vulkan0", "description": "NVIDIA GeForce RTX 4090"}], ("cpu", "vulkan")),
    ],
)
def test_llama_cpp_device_lists(devices: list[dict[str, str]], computes: tuple[str, ...]) -> None:
    assert llama_computes(devices) == computes


def test_a_vulkan_build_serves_any_gpu_but_apples() -> None:
    vulkan = [*CPU_DEVICES, {"name": "Vulkan0", "description": "NVIDIA GeForce RTX 4090"}]
    assert "llama_server-vulkan" in derive_backends(linux("nvml-one-4090.json", XLLAMACPP_CPU, vulkan))
    assert derive_backends(linux("nvml-none.json", XLLAMACPP_CPU, vulkan)) == ["llama_server-cpu"]


def test_this_machine_probes_without_error() -> None:
    """The real sources on this machine (no GPU here): nothing raises, NVML's absence is recorded."""
    hw = probe_hardware(XLLAMACPP_CPU)
    assert isinstance(hw, NodeHardware)
    assert all(g.vendor != "nvidia" for g in hw.gpus) or "nvml" not in hw.errors
