"""The kernel stays small enough to read in an afternoon: a budget, checked on every run.

Capabilities go to plugins; the kernel keeps State, apply(), decide(), the closed unions, the hook
specifications and plugin loading. When this fails, move something out rather than raise the bound.
"""

from __future__ import annotations

from pathlib import Path

import skulk_kernel

BUDGET_LINES = 4000


def test_the_kernel_is_under_its_line_budget() -> None:
    package = Path(skulk_kernel.__file__).parent
    lines = sum(len(p.read_text().splitlines()) for p in package.glob("*.py"))
    assert lines < BUDGET_LINES, f"the kernel is {lines} lines (budget {BUDGET_LINES}): move a capability to a plugin"
