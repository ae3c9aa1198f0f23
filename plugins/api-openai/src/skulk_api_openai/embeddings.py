"""Kernel embedding chunks -> the OpenAI `/v1/embeddings` body.

The Python SDK asks for `encoding_format: "base64"` unless the caller chose otherwise, and decodes
base64 of little-endian float32 (checklist E1); items stay in input order (E2). The chunks are read
by the host's `skulk_api_control.wire_common.collect_embeddings`, the same as Ollama's.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from typing import Any


def encode_base64(vector: Sequence[float]) -> str:
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def embeddings_body(
    vectors: Sequence[Sequence[float]], *, model: str, encoding_format: str, prompt_tokens: int
) -> dict[str, Any]:
    b64 = encoding_format == "base64"
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_base64(v) if b64 else list(v)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
