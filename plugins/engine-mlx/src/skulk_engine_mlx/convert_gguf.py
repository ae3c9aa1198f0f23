"""GGUF -> safetensors folder (weights, config, tokenizer, chat template), run INSIDE the conversion venv.

Why a separate script: it needs torch and transformers' GGUF loader, which must never enter the
node's own environment. `models.py` runs this file with the conversion venv's interpreter, so it
may import only the standard library plus what that venv holds (torch, transformers, gguf).

    python convert_gguf.py <file.gguf> <out_dir> [bfloat16|float32]
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf_path: Path, out_dir: Path, dtype_name: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    dtype = getattr(torch, dtype_name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the folder holds plain (dequantized) weights
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=dtype)
    fresh = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    fresh.load_state_dict(loaded.state_dict(), strict=False)
    fresh.tie_weights()
    fresh.config.torch_dtype = dtype
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(str(out_dir))
    flatten_rope(out_dir / "config.json")


def flatten_rope(config_path: Path) -> None:
    """Write ``rope_theta`` (and ``rope_scaling``) at the top level of config.json.

    Why: transformers 5 saves them nested in ``rope_parameters``; mlx-lm's llama and qwen2 read
    only the top-level keys and would silently fall back to rope_theta=10000 (wrong text).
    """
    import json

    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" in rope:
            config.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            config.setdefault("rope_scaling", rope)
        config_path.write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "bfloat16")
