"""GGUF -> safetensors folder (weights, config.json, tokenizer, chat template); runs INSIDE the vLLM venv.

Why here and not engine-mlx's converter: that one runs in a conversion venv of its own and lives
in a plugin a GPU node has no reason to install (it pulls mlx). The vLLM venv already holds
torch, transformers and gguf, so the conversion runs there and costs no second environment.
This file imports only the standard library at module level; torch and transformers come from
the venv's interpreter that runs it:

    <vllm-venv>/bin/python convert_gguf.py <file.gguf> <out_dir> [bfloat16|float32]

The recipe is FACTS.md's: transformers' GGUF loader, ``quantization_config`` dropped (the folder
holds plain dequantized weights), the state dict copied into a fresh ``from_config`` model, saved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def convert(gguf_path: Path, out_dir: Path, dtype_name: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    dtype = getattr(torch, dtype_name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(str(out_dir))
    config_path = out_dir / "config.json"
    saved = json.loads(config_path.read_text())
    saved.pop("quantization_config", None)
    config_path.write_text(json.dumps(saved, indent=2) + "\n")


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "bfloat16")
