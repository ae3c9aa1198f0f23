"""llama.cpp on accelerators, without one: the build detection, the backend tag on recorded hardware
facts (an NVIDIA box, an AMD box, a Mac, a CPU box) for each build kind, the layers a runner offloads,
and the installer's refusals and commands. Nothing here loads a GPU build or installs anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from skulk_engine_llamacpp import accel
from skulk_engine_llamacpp.accel import (
    OffloadPlan,
    choose_compute,
    compute_from_names,
    elf_needed,
    gpu_free_bytes,
    layer_bytes,
    package_names,
    plan_offload,
)
from skulk_engine_llamacpp.engine import LlamaCppEngine, LlamaServerEngine, offload_plan
from skulk_engine_llamacpp.installer import Host, LlamaCppInstaller, plan_install
from skulk_engine_llamacpp.plugin import LlamaCppConfig
from skulk_kernel.api import ModelCard
from skulk_testing.conformance import make_runner_spec

GiB = 2**30
MiB = 2**20


# ------------------------------------------------------------------------------ recorded facts
# the shapes the hardware plugin writes (facts["gpus"]: GpuFacts dumps; facts["hardware"]["builds"])


def _gpu(vendor: str, model: str, source: str, total: int | None, free: int | None, **extra: Any) -> dict[str, Any]:
    return {
        "index": 0,
        "vendor": vendor,
        "model": model,
        "source": source,
        "vram_total_bytes": total,
        "vram_free_bytes": free,
        "unified_memory": total is None,
        **extra,
    }


NVIDIA_BOX = {"gpus": [_gpu("nvidia", "NVIDIA GeForce RTX 4090", "nvml", 24 * GiB, 23 * GiB, compute_capability="8.9")]}
AMD_BOX = {"gpus": [_gpu("amd", "Radeon RX 7900 XTX", "sysfs", 24 * GiB, 23 * GiB, compute_capability="gfx1100")]}
MAC = {"gpus": [_gpu("apple", "Apple M2 Max", "system_profiler", None, None)]}
CPU_BOX: dict[str, Any] = {"gpus": []}
BOXES = {"nvidia": NVIDIA_BOX, "amd": AMD_BOX, "mac": MAC, "cpu": CPU_BOX}

#: box -> build -> the compute the engine advertises (besides cpu)
EXPECTED = {
    "nvidia": {"cpu": "cpu", "cuda": "cuda", "rocm": "cpu", "vulkan": "vulkan", "metal": "cpu"},
    "amd": {"cpu": "cpu", "cuda": "cpu", "rocm": "rocm", "vulkan": "vulkan", "metal": "cpu"},
    "mac": {"cpu": "cpu", "cuda": "cpu", "rocm": "cpu", "vulkan": "cpu", "metal": "metal"},
    "cpu": {"cpu": "cpu", "cuda": "cpu", "rocm": "cpu", "vulkan": "cpu", "metal": "cpu"},
}


@pytest.mark.parametrize("box", sorted(BOXES))
@pytest.mark.parametrize("build", ["cpu", "cuda", "rocm", "vulkan", "metal"])
def test_the_tag_follows_the_build_and_the_hardware(
    box: str, build: accel.Compute, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = EXPECTED[box][build]
    assert choose_compute(build, BOXES[box], "llama_server") == want
    monkeypatch.setattr(LlamaServerEngine, "build", lambda self: build)
    monkeypatch.setattr(LlamaCppEngine, "build", lambda self: build)
    for engine in (LlamaServerEngine(), LlamaCppEngine()):
        tags = engine.backend_tags(BOXES[box])
        # a GPU tag comes first (the one placement admits against VRAM); cpu stays for cpu-only cards
        assert tags == ([f"{engine.name}-cpu"] if want == "cpu" else [f"{engine.name}-{want}", f"{engine.name}-cpu"])


def test_the_cpu_path_is_unchanged_on_this_machine() -> None:
    """This box's packages are CPU builds: the same single tag as before, whatever the facts say."""
    server, inproc = LlamaServerEngine(), LlamaCppEngine()
    assert server.build() == "cpu"
    for facts in BOXES.values():
        assert server.backend_tags(facts) == ["llama_server-cpu"]
        if inproc.probe().available:
            assert inproc.build() == "cpu" and inproc.backend_tags(facts) == ["llama_cpp-cpu"]


def test_the_builds_own_device_list_has_the_last_word() -> None:
    """The hardware plugin asks the build's device list (in a subprocess): a CUDA build whose list shows
    no CUDA device (driver missing or too old) is advertised as cpu."""
    seen = {**NVIDIA_BOX, "hardware": {"builds": [{"engine": "llama_server", "computes": ["cpu", "cuda"]}]}}
    blind = {**NVIDIA_BOX, "hardware": {"builds": [{"engine": "llama_server", "computes": ["cpu"]}]}}
    assert choose_compute("cuda", seen, "llama_server") == "cuda"
    assert choose_compute("cuda", blind, "llama_server") == "cpu"
    assert choose_compute("cuda", blind, "llama_cpp") == "cuda"  # the hardware plugin lists no devices for it


def test_recorded_hardware_facts_have_the_shape_read_here() -> None:
    """The hardware plugin's own probe of its recorded NVIDIA machine gives facts that choose cuda."""
    pytest.importorskip("skulk_hardware")
    sys.path.insert(0, str(Path(__file__).parents[2] / "hardware" / "tests"))
    try:
        from recorded import RecordedNvml  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    from skulk_hardware.detect import probe_hardware

    devices = [{"name": "CPU", "description": "x"}, {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4090"}]
    hw = probe_hardware(
        {"llama_server": "xllamacpp 2026.10.11549 (cuda build)"},
        nvml=RecordedNvml("nvml-one-4090.json"),
        sysfs_root=Path(__file__).parent / "no-sysfs",
        llama_devices=devices,
        os_name="Linux",
        arch="x86_64",
    )
    facts = {"gpus": [g.model_dump(mode="json") for g in hw.gpus], "hardware": hw.model_dump(mode="json")}
    assert accel.backend_tags("llama_server", "cuda", facts) == ["llama_server-cuda", "llama_server-cpu"]


# ------------------------------------------------------------------------------ the build


@pytest.mark.parametrize(
    ("names", "version", "os_name", "arch", "want"),
    [
        (
            ["xllamacpp.abi3.so", "libstdc++.so.6", "libgomp.so.1", "libc.so.6"],
            "2026.10.11549",
            "Linux",
            "x86_64",
            "cpu",
        ),
        (
            ["xllamacpp.abi3.so", "libcudart.so.12", "libcublas.so.12", "libcuda.so.1"],
            "2026.10.1",
            "Linux",
            "x86_64",
            "cuda",
        ),
        (["xllamacpp.abi3.so", "libamdhip64.so.6", "libhipblas.so.2"], "2026.10.1", "Linux", "x86_64", "rocm"),
        (["xllamacpp.abi3.so", "libvulkan.so.1"], "2026.10.1", "Linux", "x86_64", "vulkan"),
        (["xllamacpp.abi3.so"], "2026.10.1+cu128", "Linux", "x86_64", "cuda"),
        (["xllamacpp.abi3.so"], "2026.10.1", "Darwin", "arm64", "metal"),
        (["xllamacpp.abi3.so"], "2026.10.1", "Darwin", "x86_64", "cpu"),
        (["libllama.so", "libggml-base.so", "libggml-cpu.so"], "0.3.36", "Linux", "x86_64", "cpu"),
        (["libllama.so", "libggml-cpu.so", "libggml-cuda.so"], "0.3.36", "Linux", "x86_64", "cuda"),
        (["libllama.so", "libggml-cpu.so", "libggml-hip.so"], "0.3.36", "Linux", "x86_64", "rocm"),
        (["libllama.so", "libggml-cpu.so", "libggml-vulkan.so"], "0.3.36", "Linux", "x86_64", "vulkan"),
    ],
)
def test_the_build_is_read_from_its_files(names: list[str], version: str, os_name: str, arch: str, want: str) -> None:
    assert compute_from_names(names, version, os_name, arch) == want


def test_the_elf_reader_lists_what_the_installed_build_links() -> None:
    xllamacpp = pytest.importorskip("xllamacpp")
    so = next(Path(xllamacpp.__file__).parent.glob("*.so"), None)
    if so is None:
        pytest.skip("xllamacpp is not an ELF build here")
    needed = elf_needed(so)
    assert any(n.startswith("libc.so") for n in needed), needed
    assert elf_needed(Path(__file__)) == []  # not an ELF file


def test_a_package_with_a_cuda_backend_file_is_a_cuda_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "fake_llama_pkg"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name in ("libllama.so", "libggml-cpu.so", "libggml-cuda.so"):
        (pkg / "lib" / name).write_bytes(b"not an elf")
    monkeypatch.syspath_prepend(str(tmp_path))
    names, _ = package_names("fake-llama-pkg", "fake_llama_pkg")
    assert "libggml-cuda.so" in names
    assert compute_from_names(names, "", "Linux", "x86_64") == "cuda"


# ------------------------------------------------------------------------------ offload

SMOLLM2 = ModelCard(
    model_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    n_layers=30,
    hidden_size=576,
    num_key_value_heads=3,
    context_length=8192,
    storage_size=98_400_000,
    sections={"runtime": {"head_dim": 64}},
)


def test_a_layer_is_its_share_of_the_weights_plus_its_kv_cache() -> None:
    kv = 2 * 8192 * 3 * 64 * 2  # K and V, f16, the card's context
    assert layer_bytes(SMOLLM2) == 98_400_000 // 30 + kv
    assert layer_bytes(SMOLLM2, n_ctx=1024) == 98_400_000 // 30 + kv // 8
    assert layer_bytes(SMOLLM2, n_ctx=1024, kv_cache_type="q8_0") == 98_400_000 // 30 + int(kv // 8 * 34 / 64)


def test_n_gpu_layers_full_partial_and_none() -> None:
    per = 100 * MiB
    full = plan_offload("auto", 30, per, 24 * GiB, reserve=512 * MiB)
    assert (full.layers, full.total, full.full) == (31, 31, True)  # every block and the output layer
    partial = plan_offload("auto", 30, per, 2 * GiB, reserve=512 * MiB)
    assert (partial.layers, partial.full) == (15, False)  # (2048 - 512) MiB / 100 MiB
    assert "VRAM short" in partial.reason and "15/31" in partial.summary()
    assert plan_offload("auto", 30, per, 256 * MiB, reserve=512 * MiB).layers == 0  # not even the reserve
    assert plan_offload("auto", 30, per, None).layers == 0  # the build sees no GPU
    assert plan_offload(12, 30, per, 24 * GiB).layers == 12  # the config's count, as given
    assert plan_offload(999, 30, per, None).layers == 31
    assert plan_offload(0, 30, per, 24 * GiB).layers == 0


def test_the_runner_offloads_on_a_gpu_tag_only() -> None:
    config = LlamaCppConfig()
    cuda = make_runner_spec(SMOLLM2, backend="llama_server-cuda")
    assert offload_plan(config, cuda, 24 * GiB) == OffloadPlan(31, 31, offload_plan(config, cuda, 24 * GiB).reason)
    short = offload_plan(config, cuda, 900 * MiB)
    per = layer_bytes(SMOLLM2)
    assert short.layers == (900 * MiB - accel.VRAM_RESERVE_BYTES) // per and 0 < short.layers < 30
    cpu = offload_plan(config, make_runner_spec(SMOLLM2, backend="llama_server-cpu"), 24 * GiB)
    assert cpu.layers == 0 and "llama_server-cpu" in cpu.reason
    fixed = offload_plan(LlamaCppConfig(n_gpu_layers=7), cuda, 24 * GiB)
    assert fixed.layers == 7


def test_free_vram_is_read_from_ggmls_device_list() -> None:
    cpu, gpu = object(), object()
    devices = [
        {"name": "CPU", "type": cpu, "memory_free": 25 * GiB},
        {"name": "CUDA0", "type": gpu, "memory_free": 20 * GiB},
        {"name": "CUDA1", "type": gpu, "memory_free": 4 * GiB},
    ]
    assert gpu_free_bytes(devices, [gpu]) == 24 * GiB
    assert gpu_free_bytes(devices[:1], [gpu]) is None


class _RecordingServer:
    made: list[dict[str, Any]] = []

    def __init__(self, path: Any, **kw: Any) -> None:
        self.kw = kw
        self.context_length = 8192
        self.n_parallel = kw["n_parallel"]
        _RecordingServer.made.append(kw)

    def start(self) -> _RecordingServer:
        return self

    def close(self) -> None:
        pass


def _load(monkeypatch: pytest.MonkeyPatch, build: str, backend: str, devices: list[dict[str, Any]]) -> Any:
    xlc = pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp import server_backend

    monkeypatch.setattr(LlamaServerEngine, "build", lambda self: build)
    monkeypatch.setattr(xlc, "get_device_info", lambda: devices)
    monkeypatch.setattr(server_backend, "LlamaServer", _RecordingServer)
    _RecordingServer.made.clear()
    spec = make_runner_spec(SMOLLM2, Path("/models/smollm2.gguf"), backend=backend)
    session = LlamaServerEngine().load(spec, lambda done, total: None)
    return session, _RecordingServer.made[-1]


def test_a_gpu_build_on_a_gpu_tag_starts_llama_cpp_with_every_layer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    xlc = pytest.importorskip("xllamacpp")
    kinds = xlc.ggml_backend_dev_type
    gpu = {"name": "CUDA0", "type": kinds.GGML_BACKEND_DEVICE_TYPE_GPU, "memory_free": 23 * GiB}
    cpu = {"name": "CPU", "type": kinds.GGML_BACKEND_DEVICE_TYPE_CPU, "memory_free": 25 * GiB}
    caplog.set_level("INFO", "skulk.engine.llamacpp")
    session, kw = _load(monkeypatch, "cuda", "llama_server-cuda", [cpu, gpu])
    assert kw["n_gpu_layers"] == 31 and session.tag == "llama_server-cuda" and session.offload.full
    assert "offloading 31/31 layers" in caplog.text

    short = {**gpu, "memory_free": 900 * MiB}
    session, kw = _load(monkeypatch, "cuda", "llama_server-cuda", [cpu, short])
    assert 0 < kw["n_gpu_layers"] < 30 and not session.offload.full
    assert any(r.levelname == "WARNING" and "VRAM short" in r.getMessage() for r in caplog.records)

    session, kw = _load(monkeypatch, "cuda", "llama_server-cpu", [cpu, gpu])
    assert kw["n_gpu_layers"] == 0 and session.tag == "llama_server-cpu"  # admitted against RAM: CPU only


def test_a_cpu_build_starts_llama_cpp_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    xlc = pytest.importorskip("xllamacpp")
    session, kw = _load(monkeypatch, "cpu", "llama_server-cpu", list(xlc.get_device_info()))
    assert kw["n_gpu_layers"] is None and session.tag == "llama_server-cpu" and session.offload is None


def test_n_gpu_layers_reaches_llama_cpps_params_only_when_set(tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    from skulk_engine_llamacpp.server_backend import LlamaServer
    from skulk_engine_llamacpp.tiny import write_tiny_chatml_gguf

    gguf = write_tiny_chatml_gguf(tmp_path / "tiny.gguf")
    default = LlamaServer(gguf)._params().n_gpu_layers
    assert default == -1  # llama.cpp's own default, untouched on the CPU path
    assert LlamaServer(gguf, n_gpu_layers=31)._params().n_gpu_layers == 31


# ------------------------------------------------------------------------------ the installer


def _host(tmp_path: Path, smi: dict[tuple[str, ...], tuple[int, str]] | None = None) -> Host:
    calls: list[list[str]] = []

    def run(cmd: list[str], **_kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        code, out = (smi or {}).get(tuple(cmd), (127, ""))
        return subprocess.CompletedProcess(cmd, code, out, "")

    host = Host(run=run, root=tmp_path, which=lambda name: f"/usr/bin/{name}" if smi is not None else None)
    host.calls = calls  # type: ignore[attr-defined]
    return host


def _nvidia(tmp_path: Path, cuda: str) -> Host:
    return _host(
        tmp_path,
        {
            ("nvidia-smi", "-L"): (0, "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-1234)\n"),
            ("nvidia-smi",): (0, f"| NVIDIA-SMI 570.86   Driver Version: 570.86   CUDA Version: {cuda}     |\n"),
        },
    )


def test_no_nvidia_gpu_refuses_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_install("cuda", _host(tmp_path))
    assert plan.refused == "no NVIDIA GPU found (nvidia-smi is not installed); the CPU build stays"
    listed_none = _host(tmp_path, {("nvidia-smi", "-L"): (9, "")})
    assert plan_install("cuda", listed_none).refused.startswith("no NVIDIA GPU found (nvidia-smi -L lists no GPU")
    assert LlamaCppInstaller("cuda", _host(tmp_path)).install(["--dry-run"]) == 1
    assert "no NVIDIA GPU found" in capsys.readouterr().err


def test_other_refusals(tmp_path: Path) -> None:
    assert "upgrade the driver" in plan_install("cuda", _nvidia(tmp_path, "12.4")).refused
    assert plan_install("rocm", _host(tmp_path)).refused.startswith("no AMD GPU with the ROCm driver found")
    assert plan_install("vulkan", _host(tmp_path)).refused.startswith("no GPU render node")


def test_the_cuda_build_is_chosen_by_the_drivers_cuda(tmp_path: Path) -> None:
    old = plan_install("cuda", _nvidia(tmp_path, "12.8"))
    assert old.refused == "" and old.index_url == "https://xorbitsai.github.io/xllamacpp/whl/cu128"
    assert old.commands == [
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--force-reinstall",
            "--no-deps",
            "--index-url",
            old.index_url,
            "xllamacpp",
        ]
    ]
    assert plan_install("cuda", _nvidia(tmp_path, "13.2")).index_url.endswith("/cu132")
    assert plan_install("cuda", _nvidia(tmp_path, "13.2"), variant="12.8").index_url.endswith("/cu128")
    both = plan_install("cuda", _nvidia(tmp_path, "12.8"), llama_cpp_python=True)
    assert both.env == {"CMAKE_ARGS": "-DGGML_CUDA=on"} and "--no-binary" in both.commands[1]


def test_rocm_and_vulkan_commands(tmp_path: Path) -> None:
    (tmp_path / "dev" / "dri").mkdir(parents=True)
    (tmp_path / "dev" / "kfd").write_text("")
    (tmp_path / "dev" / "dri" / "renderD128").write_text("")
    card = tmp_path / "sys" / "class" / "drm" / "card0" / "device"
    card.mkdir(parents=True)
    (card / "vendor").write_text("0x1002\n")
    assert plan_install("rocm", _host(tmp_path)).index_url.endswith("/rocm-7.2.4")
    assert plan_install("rocm", _host(tmp_path), variant="6.4.1").index_url.endswith("/rocm-6.4.1")
    assert plan_install("vulkan", _host(tmp_path)).index_url.endswith("/whl/vulkan")


def test_install_runs_pip_then_lists_the_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[list[str]] = []
    seen = {"build": "cuda", "devices": ["CPU: AMD EPYC", "CUDA0: NVIDIA GeForce RTX 4090"]}

    def fake_run(cmd: list[str], **_kw: Any) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, json.dumps(seen), "")

    from skulk_engine_llamacpp import installer

    monkeypatch.setattr(installer.subprocess, "run", fake_run)
    assert LlamaCppInstaller("cuda", _nvidia(tmp_path, "12.8")).install([]) == 0
    assert ran[0][-3:] == ["--index-url", "https://xorbitsai.github.io/xllamacpp/whl/cu128", "xllamacpp"]
    assert ran[1] == installer.devices_check()
    assert installer.pip_env(installer.plan_install("cuda", _nvidia(tmp_path, "12.8")), ran[0])["PIP_CONFIG_FILE"]
    out = capsys.readouterr().out
    assert "1 NVIDIA GPU(s), driver CUDA 12.8" in out and "CUDA0" in out

    seen["build"] = "cpu"  # an extra index carried a newer CPU wheel: said, not hidden
    assert LlamaCppInstaller("cuda", _nvidia(tmp_path, "12.8")).install([]) == 1
    assert "pip installed a cpu build, not cuda" in capsys.readouterr().err
    seen.update(build="cuda", devices=["CPU: AMD EPYC"])
    assert LlamaCppInstaller("cuda", _nvidia(tmp_path, "12.8")).install([]) == 1
    assert "lists no GPU device" in capsys.readouterr().err

    ran.clear()
    assert LlamaCppInstaller("cuda", _nvidia(tmp_path, "12.8")).install(["--dry-run"]) == 0
    assert ran == []  # a dry run prints the command only
    assert "--index-url https://xorbitsai.github.io/xllamacpp/whl/cu128 xllamacpp" in capsys.readouterr().out


def test_the_installers_are_registered_and_report_the_build() -> None:
    from skulk_engine_llamacpp.plugin import register_engine_installers

    found: dict[str, Any] = {}
    register_engine_installers(lambda i: found.setdefault(i.name, i))
    assert sorted(found) == ["llamacpp-cuda", "llamacpp-rocm", "llamacpp-rpc", "llamacpp-vulkan"]
    if LlamaServerEngine().probe().available:
        assert found["llamacpp-cuda"].status().startswith("not installed (xllamacpp ")
