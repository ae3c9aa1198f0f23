"""A tiny random vision model for llama.cpp, written offline: the tiny chat GGUF plus a projector GGUF.

Why: no registry reachable here ships vision weights (FACTS.md), and the vision path (the card's
`[vision] mmproj`, the server started with it, images as image_url parts, the projector's tokens in
the prompt) must be tested for real. What the model says is noise; the prompt's token count shows
that each image went through the encoder.

The projector is the smallest thing llama.cpp's CLIP loader (tools/mtmd) takes as a LLaVA-style
model: architecture `clip`, a vision encoder of one pre-norm transformer block over 8x8 patches of
a 32x32 image (with a class embedding), and the two-layer MLP projector (`mm.0`, GELU, `mm.2`) onto
the text model's 64-wide embeddings. An image costs (32 / 8)^2 = 16 tokens.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .tiny import write_tiny_chatml_gguf

TEXT_WIDTH = 64  # the tiny chat model's embedding width: the projector's output
IMAGE, PATCH, WIDTH, FFN, HEADS = 32, 8, 32, 64, 2
IMAGE_TOKENS = (IMAGE // PATCH) ** 2


def write_tiny_projector_gguf(path: Path, *, seed: int = 0) -> Path:
    """Write the projector to ``path`` (atomically; about 60 KB) and return it; idempotent."""
    import gguf
    import numpy as np

    path = Path(path)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "clip")
        w.add_name("tiny-random-projector")
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_bool("clip.has_vision_encoder", True)
        w.add_string("clip.projector_type", "mlp")
        w.add_bool("clip.use_gelu", True)
        for key, value in (
            ("image_size", IMAGE),
            ("patch_size", PATCH),
            ("embedding_length", WIDTH),
            ("feed_forward_length", FFN),
            ("projection_dim", TEXT_WIDTH),
            ("block_count", 1),
            ("attention.head_count", HEADS),
        ):
            w.add_uint32(f"clip.vision.{key}", value)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        w.add_tensor("v.patch_embd.weight", rand(WIDTH, 3, PATCH, PATCH))
        w.add_tensor("v.class_embd", rand(WIDTH))
        w.add_tensor("v.position_embd.weight", rand(IMAGE_TOKENS + 1, WIDTH))
        w.add_tensor("v.pre_ln.weight", ones(WIDTH))
        w.add_tensor("v.pre_ln.bias", zeros(WIDTH))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"v.blk.0.{name}.weight", rand(WIDTH, WIDTH))
            w.add_tensor(f"v.blk.0.{name}.bias", zeros(WIDTH))
        for name in ("ln1", "ln2"):
            w.add_tensor(f"v.blk.0.{name}.weight", ones(WIDTH))
            w.add_tensor(f"v.blk.0.{name}.bias", zeros(WIDTH))
        w.add_tensor("v.blk.0.ffn_up.weight", rand(FFN, WIDTH))
        w.add_tensor("v.blk.0.ffn_up.bias", zeros(FFN))
        w.add_tensor("v.blk.0.ffn_down.weight", rand(WIDTH, FFN))
        w.add_tensor("v.blk.0.ffn_down.bias", zeros(WIDTH))
        w.add_tensor("mm.0.weight", rand(TEXT_WIDTH, WIDTH))
        w.add_tensor("mm.0.bias", zeros(TEXT_WIDTH))
        w.add_tensor("mm.2.weight", rand(TEXT_WIDTH, TEXT_WIDTH))
        w.add_tensor("mm.2.bias", zeros(TEXT_WIDTH))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_tiny_vision_model(folder: Path, *, context_length: int = 4096) -> Path:
    """The folder with `tiny-vision.gguf` and `mmproj-tiny-vision.gguf` beside it; returns the model GGUF
    (what `/models/add` takes: the store finds the projector beside it)."""
    folder = Path(folder)
    write_tiny_projector_gguf(folder / "mmproj-tiny-vision.gguf")
    return write_tiny_chatml_gguf(folder / "tiny-vision.gguf", context_length=context_length)
