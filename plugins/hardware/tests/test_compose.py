"""The `auto` profile: each installed plugin in or out for this machine, with its reason.

The verdict logic is pure (decide) and tested from made-up facts; each plugin's `plugin_fits` is
tested from the facts of machines we do not have (Apple silicon, an NVIDIA GPU); `profile show
auto` is run as a user runs it, on this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from skulk_hardware.compose import LISTED, decide
from skulk_kernel.profiles import load_profile

LINUX: dict[str, Any] = {"hardware": {"os": "Linux", "arch": "x86_64", "gpus": [], "builds": []}, "engine_builds": {}}
MAC: dict[str, Any] = {
    "hardware": {"os": "Darwin", "arch": "arm64", "gpus": [{"vendor": "apple", "model": "M2"}], "builds": []},
    "engine_builds": {"mlx": "mlx 0.29.0"},
}
CUDA: dict[str, Any] = {
    "hardware": {"os": "Linux", "arch": "x86_64", "gpus": [{"vendor": "nvidia", "model": "H200"}], "builds": []},
    "engine_builds": {"vllm-cuda": "vllm 0.33.0"},
    "derived_backends": ["vllm-cuda"],
}


def test_listed_plugins_are_in_unless_they_say_otherwise_and_others_are_out() -> None:
    fits = {
        "engine-x": lambda facts, chosen: (False, "no x here"),
        "api-y": lambda facts, chosen: (("engine-z" in chosen), f"after {chosen}"),
        "engine-z": lambda facts, chosen: (True, "z"),
        "third-party": lambda facts, chosen: (True, "fits anywhere"),
        "raises": lambda facts, chosen: 1 / 0,
        "silent": lambda facts, chosen: None,
    }
    installed = {"master", "engine-x", "engine-z", "api-y", "third-party", "raises", "silent", "unlisted", "broken"}
    found = decide(
        ("master", "engine-x", "engine-z", "api-y", "raises", "silent", "missing", "broken"),
        installed,
        {"broken": "does not load: ImportError()"},
        fits,
        {},
    )
    verdicts = {v.plugin: (v.fits, v.reason) for v in found}
    assert [v.plugin for v in found][-2:] == ["third-party", "unlisted"]  # the others, after the candidates
    assert verdicts["master"] == (True, LISTED)
    assert verdicts["engine-x"] == (False, "no x here")
    assert verdicts["api-y"] == (True, "after ['master', 'engine-z']")  # sees what is already in
    assert verdicts["raises"][0] is False and "ZeroDivisionError" in verdicts["raises"][1]
    assert verdicts["silent"] == (True, LISTED)
    assert verdicts["missing"][0] is False and "not installed" in verdicts["missing"][1]
    assert verdicts["broken"] == (False, "does not load: ImportError()")
    assert verdicts["third-party"] == (True, "fits anywhere")
    assert verdicts["unlisted"][0] is False and "plugin_fits" in verdicts["unlisted"][1]


def test_engines_by_hardware() -> None:
    from skulk_engine_mlx import plugin as mlx
    from skulk_engine_vllm import plugin as vllm

    assert mlx.plugin_fits(MAC, []) == (True, "mlx 0.29.0 on Metal")
    linux_mlx = mlx.plugin_fits(LINUX | {"engine_builds": {"mlx": "mlx 0.29.0"}}, [])
    assert linux_mlx is not None and not linux_mlx[0] and "slower than llama.cpp" in linux_mlx[1]
    assert vllm.plugin_fits(CUDA, []) == (True, "vllm 0.33.0 (CUDA) on H200")
    cpu_only = vllm.plugin_fits(LINUX | {"engine_builds": {"vllm-cpu": "vllm 0.33.0"}}, [])
    assert cpu_only is not None and not cpu_only[0] and "no NVIDIA GPU" in cpu_only[1]
    gpu_no_venv = vllm.plugin_fits(CUDA | {"engine_builds": {}, "derived_backends": []}, [])
    assert gpu_no_venv is not None and "engines install vllm --flavor cuda" in gpu_no_venv[1]


def test_media_api_follows_the_media_engines() -> None:
    from skulk_api_media import plugin as media

    assert media.plugin_fits({}, ["master"])[0] is False  # type: ignore[index]
    assert media.plugin_fits({}, ["master", "video-comfyui"]) == (True, "serves video-comfyui")


def test_the_default_profile_is_auto_and_composes_only_when_asked() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SKULK_PROFILE"}
    code = "from skulk_kernel import cli; print(cli.DEFAULT_PROFILE)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "auto"
    candidates = load_profile("auto", compose=False)
    assert candidates.composer == "hardware" and not candidates.notes
    assert {"engine-mlx", "engine-vllm", "speech", "steward"} <= set(candidates.plugins)


def test_profile_show_auto_lists_every_installed_plugin_with_its_reason() -> None:
    from skulk_kernel.plugins import installed_plugins

    before = set(installed_plugins())
    out = subprocess.run(
        [sys.executable, "-m", "skulk_kernel.cli", "profile", "show", "auto"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("composed for this machine (in/out, why):\n")[1].splitlines()
    verdicts = {line.split()[1]: (line.split()[0], line) for line in notes}
    after = set(installed_plugins())
    # every installed plugin, in or out (another test may pip-install an example plugin meanwhile)
    assert before & after <= set(verdicts) <= before | after
    assert verdicts["engine-llamacpp"][0] == "in" and "on cpu" in verdicts["engine-llamacpp"][1]
    assert verdicts["engine-echo"][0] == "out"
    assert verdicts["steward"][0] == "in" and verdicts["master"][0] == "in"
    if sys.platform == "linux":
        assert verdicts["engine-mlx"][0] == "out" and "slower than llama.cpp" in verdicts["engine-mlx"][1]
    shown = out.stdout.split("plugins:\n")[1].split("planes:")[0]
    assert "engine-echo" not in shown and "engine-llamacpp" in shown  # the plugins the node loads
    assert "[steward]" in out.stdout and "on_first_use" in out.stdout
