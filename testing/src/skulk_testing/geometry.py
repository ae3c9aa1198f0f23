"""Synthetic model cards with the real geometry of common models, and node capacities to place them on.

Sizes are the Q4_K_M GGUF files' (bartowski's quantizations); layers, KV heads and head_dim are
the models' config.json. Used by the planner's admission tests and ``bench/bench_admission.py``.
"""

from __future__ import annotations

from skulk_kernel.api import ModelCard, ModelId, NodeCapacity

GiB = 1024**3
GB = 10**9
LLAMA = ("llama_server-cpu",)


def _card(model_id: str, layers: int, hidden: int, context: int, gib: float) -> ModelCard:
    return ModelCard(
        model_id=ModelId(model_id),
        n_layers=layers,
        hidden_size=hidden,
        num_key_value_heads=8,
        context_length=context,
        storage_size=int(gib * GiB),
        quantization="Q4_K_M",
        compatible_backends=LLAMA,
        sections={"runtime": {"head_dim": 128}},
    )


#: Llama-3.1-8B-Instruct: 32 layers, hidden 4096, 8 KV heads of 128, 131,072 tokens, Q4_K_M 4.58 GiB.
LLAMA_8B = _card("synthetic/Llama-3.1-8B-Q4_K_M", 32, 4096, 131_072, 4.58)
#: Qwen2.5-32B-Instruct: 64 layers, hidden 5120, 8 KV heads of 128, 32,768 tokens (131,072 with
#: YaRN), Q4_K_M 18.5 GiB.
QWEN_32B = _card("synthetic/Qwen2.5-32B-Q4_K_M", 64, 5120, 32_768, 18.5)
QWEN_32B_YARN = _card("synthetic/Qwen2.5-32B-YaRN-Q4_K_M", 64, 5120, 131_072, 18.5)
#: Llama-3.1-70B-Instruct: 80 layers, hidden 8192, 8 KV heads of 128, 131,072 tokens, Q4_K_M 39.6 GiB.
LLAMA_70B = _card("synthetic/Llama-3.1-70B-Q4_K_M", 80, 8192, 131_072, 39.6)

CARDS = (LLAMA_8B, QWEN_32B, QWEN_32B_YARN, LLAMA_70B)


def machine(
    node_id: str,
    total_gb: float,
    *,
    used_gb: float = 0.0,
    backends: tuple[str, ...] = LLAMA,
    os: str = "Linux",
    vram_gb: float | None = None,
) -> NodeCapacity:
    """A node of `total_gb` GB of RAM with `used_gb` of it in use (the OS, other programs)."""
    return NodeCapacity(
        node_id=node_id,
        ram_available=int((total_gb - used_gb) * GB),
        ram_total=int(total_gb * GB),
        backends=backends,
        splits={b: ("Pipeline", "Tensor") for b in backends if b.startswith("mlx")},
        os=os,
        vram_available=None if vram_gb is None else int(vram_gb * GB),
    )
