"""Ranks as separate spawned processes on 127.0.0.1, as runners run them.

Fast: the tiny model split two ways equals one rank; a rank whose peer never starts fails after
its formation deadline with the reason; a dead peer fails the stream within seconds. Slow (the
real SmolLM2): a 3-way tensor split gives one rank's greedy tokens. The real model's 2- and 3-rank
pipelines (each rank holding less memory than the whole) and Qwen 0.5B's 2-way tensor split are
proved once, through real node processes, in ``tests/split/test_split_mlx.py``: the same ranks,
so proving them here as well cost CI about eight minutes for nothing the node tests miss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SMOLLM2_CARD
from skulk_engine_mlx.localranks import PROMPTS, RankReport, run_ranks
from skulk_kernel.api import ModelCard


def assert_all_equal(reference: RankReport, reports: list[RankReport]) -> None:
    for report in reports:
        assert report.error is None, f"rank {report.rank}: {report.error}"
    for report in reports:
        assert report.tokens == reference.tokens, f"rank {report.rank} differs from the single rank"


def test_tiny_two_rank_pipeline_equals_one_rank(tiny_model: Path, tiny_card: ModelCard) -> None:
    prompts = PROMPTS[:2]
    single = run_ranks(tiny_model, tiny_card, 1, prompts=prompts, max_tokens=16, timeout_s=60)
    assert single[0].error is None, single[0].error
    assert_all_equal(single[0], run_ranks(tiny_model, tiny_card, 2, prompts=prompts, max_tokens=16, timeout_s=90))


def test_rank_whose_peer_never_starts_fails_after_the_deadline(tiny_model: Path, tiny_card: ModelCard) -> None:
    (report,) = run_ranks(tiny_model, tiny_card, 2, prompts=PROMPTS[:1], deadline_s=3.0, timeout_s=60, only_ranks=[1])
    assert report.error is not None and report.error.startswith(
        "FormationTimeout: rank 1 of 2 could not form its group within 3 s: peer rank 0 at 127.0.0.1:"
    ), report.error
    assert report.error.endswith("never joined")


# ------------------------------------------------------------------------------ real model


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_three_way_tensor_equals_single_rank(smollm2_mlx: Path) -> None:
    # SmolLM2 has 9 heads and 3 KV heads: 2-way tensor is impossible, 3-way works. (The real model's
    # pipelines and Qwen's 2-way tensor split are proved through real nodes in tests/split.)
    prompts = PROMPTS[1:2]  # a poem: 16 tokens, not the capital of France's 7 and an end
    (single,) = run_ranks(smollm2_mlx, SMOLLM2_CARD, 1, prompts=prompts, max_tokens=16, timeout_s=240)
    assert single.error is None, single.error
    assert len(single.tokens[0]) == 16  # a real answer, not an early stop
    reports = run_ranks(smollm2_mlx, SMOLLM2_CARD, 3, "Tensor", prompts=prompts, max_tokens=16, timeout_s=240)
    assert_all_equal(single, reports)


def test_a_dead_peer_fails_the_stream_within_seconds(tiny_model: Path, tiny_card: ModelCard) -> None:
    (report,) = run_ranks(
        tiny_model,
        tiny_card,
        2,
        prompts=PROMPTS[:1],
        max_tokens=16,
        collective_timeout_s=8.0,
        timeout_s=90,
        exit_after_load=1,
    )
    assert report.error is not None and "mlx rank 0 of 2 failed" in report.error, report.error
    assert report.failed_after_s is not None and report.failed_after_s < 10.0, report
    print(f"\ndead peer: rank 0 failed after {report.failed_after_s:.2f} s: {report.error}")
