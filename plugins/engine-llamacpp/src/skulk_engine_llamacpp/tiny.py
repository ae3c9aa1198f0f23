"""A tiny random llama GGUF with a byte-level BPE tokenizer and a ChatML template, written offline.

Why: load tests (32 streams of 256 tokens) must exercise the real serving path -- llama.cpp's
server, its slots, the token gate, the node's streams -- in bounded time on a busy 2-core box. A
2-layer, 64-wide model decodes thousands of tokens a second, so a burst takes seconds, not the
minutes SmolLM2 needs; what it writes is noise, which a load test does not read.

Only printable ASCII can be sampled: the output rows of every other byte and of the special
tokens are zero while the rest are large, so the model never writes broken UTF-8 (the server
would hold such a stream back) and practically never ends a turn early.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable unicode table (what byte-level BPE vocabularies spell)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = dict(zip(keep, keep, strict=True))
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = 256 + extra
            extra += 1
    return [chr(table[b]) for b in range(256)]


def write_tiny_chatml_gguf(path: Path, *, context_length: int = 16384, seed: int = 0) -> Path:
    """Write the model to ``path`` (atomically; about 0.2 MB) and return it; idempotent."""
    import gguf
    import numpy as np

    path = Path(path)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d, ff, heads, layers = 64, 128, 4, 2
    tokens = [*_byte_symbols(), *SPECIALS]
    n_vocab = len(tokens)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name("tiny-random-chatml")
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_context_length(context_length)
        w.add_embedding_length(d)
        w.add_feed_forward_length(ff)
        w.add_block_count(layers)
        w.add_head_count(heads)
        w.add_head_count_kv(heads)
        w.add_rope_dimension_count(d // heads)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * len(SPECIALS))
        w.add_token_merges(["Ġ t", "Ġ a", "h e"])  # llama.cpp wants the key; bytes alone tokenize anything
        w.add_bos_token_id(256)
        w.add_eos_token_id(258)  # <|im_end|> ends a turn
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML)

        def mat(rows: int, cols: int) -> np.ndarray:
            return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

        w.add_tensor("token_embd.weight", mat(n_vocab, d))
        for i in range(layers):
            w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, dtype=np.float32))
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                w.add_tensor(f"blk.{i}.{name}.weight", mat(d, d))
            w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, dtype=np.float32))
            w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(ff, d))
            w.add_tensor(f"blk.{i}.ffn_up.weight", mat(ff, d))
            w.add_tensor(f"blk.{i}.ffn_down.weight", mat(d, ff))
        w.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
        out = (rng.standard_normal((n_vocab, d)) * 0.5).astype(np.float32)
        printable = np.zeros(n_vocab, dtype=bool)
        printable[[tokens.index(c) for c in _byte_symbols()[0x20:0x7F]]] = True
        out[~printable] = 0.0
        w.add_tensor("output.weight", out)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
