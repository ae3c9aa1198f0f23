"""Replays recorded NVML answers through the same function names pynvml (nvidia-ml-py) has.

A unit-test double of the library, never the proof of a GPU run: the JSON files hold the values
NVML reports for those devices (memory in bytes, power in milliwatts, CUDA as 12040 = 12.4).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DATA = Path(__file__).parent / "data"


class NVMLError(Exception):
    pass


class RecordedNvml:
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, name: str) -> None:
        self.data: dict[str, Any] = json.loads((DATA / name).read_text())
        self.initialised = 0

    def nvmlInit(self) -> None:
        if "init_error" in self.data:
            raise NVMLError(self.data["init_error"])
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.data["driver"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self.data["cuda_driver"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.data["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return dict(self.data["devices"][index])

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> bytes:
        return str(h["name"]).encode()  # older bindings answer bytes

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(total=h["total"], free=h["free"], used=h["used"])

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(gpu=h["util_gpu"], memory=0)

    def nvmlDeviceGetTemperature(self, h: dict[str, Any], _sensor: int) -> int:
        return int(h["temperature"])

    def nvmlDeviceGetPowerUsage(self, h: dict[str, Any]) -> int:
        if h.get("power_mw") is None:
            raise NVMLError("Not Supported")
        return int(h["power_mw"])

    def nvmlDeviceGetCudaComputeCapability(self, h: dict[str, Any]) -> tuple[int, int]:
        return tuple(h["cc"])  # type: ignore[return-value]

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(busId=h["bus_id"])
