"""Model cards from TOML, config.json and GGUF headers.

A card TOML carries the reference's top-level fields plus free sections ([reasoning], [tooling],
[runtime], [placement], [source], ...). `[source]` says how this store provisions the files offline.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from skulk_kernel.api import ModelCard

CARD_FIELDS = set(ModelCard.model_fields)


class CardError(ValueError):
    """A card that does not describe a model; the message says what is missing."""


def card_from_mapping(data: dict[str, Any], source: str) -> ModelCard:
    fields = {k: v for k, v in data.items() if k in CARD_FIELDS}
    sections = {k: v for k, v in data.items() if k not in CARD_FIELDS and isinstance(v, dict)}
    unknown = [k for k in data if k not in CARD_FIELDS and not isinstance(data[k], dict)]
    if unknown:
        raise CardError(f"{source}: unknown card fields {unknown}")
    fields["sections"] = {**fields.get("sections", {}), **sections}
    for key in ("tasks", "capabilities", "compatible_backends", "backend_preference"):
        if key in fields:
            fields[key] = tuple(fields[key])
    try:
        return ModelCard(**fields)
    except Exception as exc:
        raise CardError(f"{source}: {exc}") from None


#: llama.cpp's backend tags for a GGUF, GPU builds first: a node advertises only what its build and
#: hardware run (engine-llamacpp's accel.py), so the planner takes the GPU where there is one (and
#: its VRAM holds the model) and the CPU otherwise. ``llama_rpc`` (several nodes over llama.cpp's RPC)
#: comes last for each: whole-model engines win wherever one node holds the model.
GGUF_BACKENDS = tuple(
    f"{engine}-{compute}"
    for compute in ("cuda", "rocm", "metal", "vulkan", "cpu")
    for engine in ("llama_server", "llama_cpp", "llama_rpc")
)


def with_current_backends(card: ModelCard) -> ModelCard:
    """A GGUF card written before this version knew some llama.cpp backends (a sidecar installed before
    ``llama_rpc`` existed) gets today's list, so a model on disk splits across nodes like a new one."""
    known = set(card.compatible_backends)
    if "llama_server-cpu" not in known or known >= set(GGUF_BACKENDS) or not known <= set(GGUF_BACKENDS):
        return card
    engines = {b.split("-", 1)[0] for b in known} | ({"llama_rpc"} if "TextGeneration" in card.tasks else set())
    current = tuple(b for b in GGUF_BACKENDS if b.split("-", 1)[0] in engines)
    return card.model_copy(update={"compatible_backends": current, "backend_preference": current})


def card_from_toml(path: Path) -> ModelCard:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CardError(f"{path}: not valid TOML: {exc}") from None
    return card_from_mapping(data, str(path))


def card_from_config_json(folder: Path, model_id: str) -> ModelCard:
    """A Hugging Face style folder: config.json gives the architecture numbers."""
    config = json.loads((folder / "config.json").read_text())
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    heads = config.get("num_attention_heads", 1)
    hidden = config.get("hidden_size") or config.get("d_model") or 1
    return ModelCard(
        model_id=model_id,
        n_layers=config.get("num_hidden_layers") or config.get("n_layer") or 1,
        hidden_size=hidden,
        num_key_value_heads=config.get("num_key_value_heads", heads),
        family=str(config.get("model_type", "")),
        context_length=config.get("max_position_embeddings", 2048),
        storage_size=size,
        # safetensors need an engine that reads them (MLX, vLLM); llama.cpp and echo do not
        compatible_backends=("mlx-metal", "mlx-cpu", "vllm-cuda"),
        capabilities=("vision",) if isinstance(config.get("vision_config"), dict) else (),  # a VLM (mlx-vlm)
        sections={"runtime": {"head_dim": hidden // max(1, heads)}},
    )


def gguf_metadata(path: Path) -> dict[str, Any]:
    """Scalar metadata of a GGUF file (arrays such as the vocabulary are skipped)."""
    from .gguf_header import NotGGUF, read_file_metadata

    try:
        return read_file_metadata(path)
    except (NotGGUF, ValueError) as exc:
        raise CardError(f"{path}: not a readable GGUF file ({exc})") from None


def card_from_gguf_metadata(meta: dict[str, Any], model_id: str, size: int, file_name: str) -> ModelCard:
    arch = meta.get("general.architecture")
    if not arch:
        raise CardError(f"{file_name}: GGUF header has no general.architecture")

    def arch_key(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    heads = arch_key("attention.head_count", 1)
    hidden = arch_key("embedding_length", 1)
    is_embedding = arch in ("bert", "nomic-bert", "jina-bert-v2") or arch_key("pooling_type") is not None
    is_reranker = arch_key("pooling_type") == 4  # llama.cpp's RANK pooling: a cross-encoder with a score head
    return ModelCard(
        model_id=model_id,
        n_layers=arch_key("block_count", 1),
        hidden_size=hidden,
        num_key_value_heads=arch_key("attention.head_count_kv", heads),
        family=arch,
        quantization=_file_type_name(meta.get("general.file_type")),
        context_length=arch_key("context_length", 2048),
        storage_size=size,
        gguf_file=file_name,
        tasks=("TextRerank",) if is_reranker else ("TextEmbedding",) if is_embedding else ("TextGeneration",),
        capabilities=("rerank",) if is_reranker else (),
        embedding_dimensions=hidden if is_embedding and not is_reranker else None,
        compatible_backends=GGUF_BACKENDS,
        backend_preference=GGUF_BACKENDS,
        sections={"runtime": {"head_dim": hidden // max(1, heads)}},
    )


def _file_type_name(file_type: Any) -> str:
    """llama.cpp's numeric file type as the name operators know (3 -> "Q4_1")."""
    if file_type is None:
        return ""
    try:
        from gguf import LlamaFileType

        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return str(file_type)


def card_from_gguf(path: Path, model_id: str) -> ModelCard:
    return card_from_gguf_metadata(gguf_metadata(path), model_id, path.stat().st_size, path.name)
