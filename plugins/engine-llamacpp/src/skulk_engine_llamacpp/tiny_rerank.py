"""A tiny random BERT cross-encoder (a reranker) as a GGUF, written offline with the `gguf` package.

Why: no registry reachable here ships a reranking model, yet `/v1/rerank` must be tested on the
real path (llama.cpp's server in rank pooling, the runner, the node's routing). llama.cpp ranks with
a BERT-family encoder whose `[CLS]` state goes through the classification head: `cls` (an optional
dense layer with tanh) and `cls.output` (hidden -> one score), with `pooling_type` RANK. llama.cpp's
converter writes a `BertForSequenceClassification` that way (its `classifier` becomes `cls.output`;
the pooler is dropped). The weights here are random, so the scores are noise but deterministic for
a seed: tests check the shape, the order the API sorts into, and the errors, not relevance.

The vocabulary is WordPiece: the specials, every lowercase letter and digit as a word start and as a
`##` continuation, and a few whole words, so any lowercase ASCII text tokenizes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = ("the", "a", "is", "of", "and", "to", "in", "what", "capital", "france", "paris", "cat", "dog", "sky", "blue")
ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
PUNCT = ".,?!'\"-:;()"


def _vocab() -> list[str]:
    return list(dict.fromkeys([*SPECIALS, *WORDS, *ALNUM, *(f"##{c}" for c in ALNUM), *PUNCT]))  # unique


def _spelled(token: str) -> str:
    """llama.cpp's WPM spelling: a word start carries U+2581, a `##` continuation is bare."""
    if token in SPECIALS:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def write_tiny_reranker_gguf(path: Path, *, context_length: int = 512, seed: int = 0) -> Path:
    """Write the model to ``path`` (atomically; about 0.2 MB) and return it; idempotent."""
    import gguf
    import numpy as np

    path = Path(path)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d, ff, heads, layers = 32, 64, 2, 2
    vocab = _vocab()
    index = {t: i for i, t in enumerate(vocab)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    arch = gguf.MODEL_ARCH.BERT
    w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("tiny-reranker")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(context_length)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([_spelled(t) for t in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in vocab])
    w.add_bos_token_id(index["[CLS]"])
    w.add_eos_token_id(index["[SEP]"])
    w.add_sep_token_id(index["[SEP]"])
    w.add_unk_token_id(index["[UNK]"])
    w.add_pad_token_id(index["[PAD]"])
    w.add_mask_token_id(index["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str) -> None:
        w.add_tensor(f"{name}.weight", np.ones(d, dtype=np.float32))
        w.add_tensor(f"{name}.bias", np.zeros(d, dtype=np.float32))

    w.add_tensor("token_embd.weight", rand(len(vocab), d, scale=1.0))
    w.add_tensor("token_types.weight", rand(2, d))
    w.add_tensor("position_embd.weight", rand(context_length, d, scale=0.1))
    norm("token_embd_norm")
    for b in range(layers):
        for part, rows, cols in (("attn_q", d, d), ("attn_k", d, d), ("attn_v", d, d), ("attn_output", d, d)):
            w.add_tensor(f"blk.{b}.{part}.weight", rand(rows, cols))
            w.add_tensor(f"blk.{b}.{part}.bias", rand(rows, scale=0.02))
        norm(f"blk.{b}.attn_output_norm")
        w.add_tensor(f"blk.{b}.ffn_up.weight", rand(ff, d))
        w.add_tensor(f"blk.{b}.ffn_up.bias", rand(ff, scale=0.02))
        w.add_tensor(f"blk.{b}.ffn_down.weight", rand(d, ff))
        w.add_tensor(f"blk.{b}.ffn_down.bias", rand(d, scale=0.02))
        norm(f"blk.{b}.layer_output_norm")
    w.add_tensor("cls.weight", rand(d, d, scale=0.5))
    w.add_tensor("cls.bias", rand(d, scale=0.02))
    w.add_tensor("cls.output.weight", rand(1, d, scale=1.0))
    w.add_tensor("cls.output.bias", np.zeros(1, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path
