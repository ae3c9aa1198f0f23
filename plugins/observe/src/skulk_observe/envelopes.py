"""Performance envelopes: what each (hardware class, model, engine, quantization) really delivers.

Learned from served traffic, not from a benchmark: every finished generation's last chunk carries
GenerationStats (tokens, rates), and the API node knows how many requests the same instance was
serving when it started. Per concurrency level we keep the per-stream decode rate; the aggregate
rate is level x per-stream rate, and the knee is the first level after which doubling the streams
adds less than `KNEE_GAIN` of aggregate throughput (more streams past it mostly add latency).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

KNEE_GAIN = 1.10  # aggregate throughput must grow by 10% to call the next level worth it


@dataclass
class _Level:
    samples: int = 0
    decode_tps_sum: float = 0.0
    prefill_tps_sum: float = 0.0
    prefill_samples: int = 0
    ttft_ms_sum: float = 0.0
    ttft_samples: int = 0

    def merge(self, other: _Level) -> None:
        self.samples += other.samples
        self.decode_tps_sum += other.decode_tps_sum
        self.prefill_tps_sum += other.prefill_tps_sum
        self.prefill_samples += other.prefill_samples
        self.ttft_ms_sum += other.ttft_ms_sum
        self.ttft_samples += other.ttft_samples


@dataclass
class Envelope:
    hardware_class: str
    model_id: str
    engine: str
    quantization: str
    levels: dict[int, _Level] = field(default_factory=dict)

    def add(self, concurrency: int, decode_tps: float | None, prefill_tps: float | None, ttft_ms: float | None) -> None:
        level = self.levels.setdefault(max(1, concurrency), _Level())
        if decode_tps is not None and decode_tps > 0:
            level.samples += 1
            level.decode_tps_sum += decode_tps
        if prefill_tps is not None and prefill_tps > 0:
            level.prefill_samples += 1
            level.prefill_tps_sum += prefill_tps
        if ttft_ms is not None and ttft_ms >= 0:
            level.ttft_samples += 1
            level.ttft_ms_sum += ttft_ms

    def knee(self) -> int | None:
        """The concurrency past which more streams stop buying throughput (None: not seen yet)."""
        agg = sorted((c, c * lv.decode_tps_sum / lv.samples) for c, lv in self.levels.items() if lv.samples)
        if len(agg) < 2:
            return None
        for (c, a), (c_next, a_next) in itertools.pairwise(agg):
            doublings = math.log2(c_next / c)  # compare uneven steps (1 -> 3 -> 4) per doubling
            if a <= 0 or (a_next / a) ** (1 / doublings) < KNEE_GAIN:
                return c
        return None

    def wire(self) -> dict[str, Any]:
        total = sum(lv.samples for lv in self.levels.values())
        decode = sum(lv.decode_tps_sum for lv in self.levels.values())
        n_prefill = sum(lv.prefill_samples for lv in self.levels.values())
        prefill = sum(lv.prefill_tps_sum for lv in self.levels.values())
        n_ttft = sum(lv.ttft_samples for lv in self.levels.values())
        ttft = sum(lv.ttft_ms_sum for lv in self.levels.values())
        single = self.levels.get(1)
        return {
            "hardwareClass": self.hardware_class,
            "modelId": self.model_id,
            "engine": self.engine,
            "quantization": self.quantization,
            "samples": total,
            "decodeTokensPerSecond": round(decode / total, 2) if total else None,
            "singleStreamDecodeTokensPerSecond": round(single.decode_tps_sum / single.samples, 2)
            if single and single.samples
            else None,
            "prefillTokensPerSecond": round(prefill / n_prefill, 2) if n_prefill else None,
            "ttftMs": round(ttft / n_ttft, 2) if n_ttft else None,
            "concurrencyKnee": self.knee(),
            "byConcurrency": {
                str(c): {
                    "samples": lv.samples,
                    "decodeTokensPerSecondPerStream": round(lv.decode_tps_sum / lv.samples, 2) if lv.samples else None,
                    "aggregateDecodeTokensPerSecond": round(c * lv.decode_tps_sum / lv.samples, 2)
                    if lv.samples
                    else None,
                }
                for c, lv in sorted(self.levels.items())
            },
        }

    def raw(self) -> dict[str, Any]:
        """The sums, so envelopes learned on several API nodes merge exactly."""
        return {
            "key": [self.hardware_class, self.model_id, self.engine, self.quantization],
            "levels": {str(c): lv.__dict__ for c, lv in self.levels.items()},
        }


class EnvelopeBook:
    def __init__(self) -> None:
        self.envelopes: dict[tuple[str, str, str, str], Envelope] = {}

    def observe(
        self,
        key: tuple[str, str, str, str],
        concurrency: int,
        decode_tps: float | None,
        prefill_tps: float | None,
        ttft_ms: float | None,
    ) -> None:
        env = self.envelopes.get(key)
        if env is None:
            env = self.envelopes[key] = Envelope(*key)
        env.add(concurrency, decode_tps, prefill_tps, ttft_ms)

    def raw(self) -> list[dict[str, Any]]:
        return [e.raw() for e in self.envelopes.values()]

    @staticmethod
    def merged(raws: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        book: dict[tuple[str, ...], Envelope] = {}
        for raw in raws:
            for item in raw:
                key = tuple(item["key"])
                env = book.get(key)
                if env is None:
                    env = book[key] = Envelope(*key)
                for c, fields in item["levels"].items():
                    env.levels.setdefault(int(c), _Level()).merge(_Level(**fields))
        return [e.wire() for _, e in sorted(book.items())]
