"""Names `ollama pull` accepts as hub references (`skulk_store.manage.hub_reference`)."""

from __future__ import annotations

import pytest
from skulk_store.manage import hub_reference


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("owner/name", ("owner/name", None)),
        ("owner/name:latest", ("owner/name", None)),
        ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M", ("bartowski/SmolLM2-135M-Instruct-GGUF", "Q4_K_M")),
        ("huggingface.co/owner/name:model.Q8_0.gguf", ("owner/name", "model.Q8_0.gguf")),
        ("https://huggingface.co/owner/name", ("owner/name", None)),
        ("smollm2", (None, None)),  # a catalog name, not the hub's
        ("llama3.2:1b", (None, None)),
        ("a/b/c", (None, None)),
    ],
)
def test_hub_reference(name: str, expected: tuple[str | None, str | None]) -> None:
    assert hub_reference(name) == expected
