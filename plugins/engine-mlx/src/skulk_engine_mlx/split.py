"""Splitting a loaded mlx-lm model across ranks: our own pipeline split, and mlx-lm's tensor sharding.

Pipeline (any decoder mlx-lm loads, not only the architectures with mlx-lm's own helper): the
model is loaded lazily (weights are memory-mapped, nothing is read yet), then rank r keeps only
its layers [start_layer, end_layer) and drops the rest before anything is evaluated, so dropped
weights are never materialised. The model's own forward code still runs (masks, sliding windows
and per-architecture quirks stay mlx-lm's), with these changes, made by swapping the class of a
few modules for a subclass:

* the first kept layer receives the hidden state from rank r-1 (``recv_like``) instead of using
  its input; the last kept layer sends its output to rank r+1 and returns it tied to the send
  (``mx.depends``), so evaluating anything downstream performs the send;
* rank 0 keeps the input embedding; later ranks replace it with a stub that returns zeros of the
  hidden size (the shape the receive needs); the last rank keeps the final norm and LM head,
  earlier ranks replace them with stubs that return a 1-wide slice of their input (cheap, and it
  keeps the send in the graph);
* tied embeddings: the last rank keeps the embedding matrix for ``as_linear`` but its lookup
  returns zeros; rank 0 keeps the lookup, its ``as_linear`` is stubbed.

The KV cache each rank makes covers its own layers only (``make_cache`` iterates ``layers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

EMBED_NAMES = ("embed_tokens", "wte", "tok_embeddings", "word_embeddings", "embedding")
NORM_NAMES = ("norm", "ln_f", "final_layernorm", "norm_f", "final_norm")
HEAD_NAMES = ("lm_head", "output")


@dataclass(frozen=True)
class StageSpec:
    """This rank's stage of a pipeline: which layers, and its neighbours in pipeline order."""

    rank: int
    world_size: int
    start_layer: int
    end_layer: int
    n_layers: int

    @property
    def first(self) -> bool:
        return self.start_layer == 0

    @property
    def last(self) -> bool:
        return self.end_layer == self.n_layers

    def check(self) -> None:
        """Stages follow rank order: rank 0 starts at layer 0, the last rank ends at n_layers."""
        if not 0 <= self.start_layer < self.end_layer <= self.n_layers:
            raise ValueError(f"bad layer range [{self.start_layer}, {self.end_layer}) of {self.n_layers}")
        if self.first != (self.rank == 0) or self.last != (self.rank == self.world_size - 1):
            raise ValueError(
                f"rank {self.rank} of {self.world_size} holds layers [{self.start_layer}, {self.end_layer}) "
                f"of {self.n_layers}: pipeline stages must follow rank order (ring neighbours only)"
            )


def find_layers(model: nn.Module) -> tuple[nn.Module, str]:
    """The module that owns the decoder layer list, and its attribute name."""
    target = getattr(model, "layers", None)
    if not isinstance(target, list) or not target:
        raise ValueError(f"{type(model).__name__} exposes no `layers` list: cannot split it")
    for _, module in model.named_modules():
        for key, value in module.items():
            if value is target:
                return module, key
    raise ValueError(f"cannot find the owner of {type(model).__name__}.layers")


def _first_named(module: nn.Module, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in module and hasattr(module[n], "parameters")), None)


def _embedding_dtype(embedding: Any) -> mx.Dtype:
    scales = embedding.get("scales") if hasattr(embedding, "get") else None
    return scales.dtype if scales is not None else embedding.weight.dtype


def _retype(module: Any, name: str, overrides: dict[str, Any]) -> None:
    """Give one module instance a subclass that overrides some methods (keys, parameters unchanged)."""
    base = type(module)
    module.__class__ = type(f"{name}{base.__name__}", (base,), overrides)


def _stubs() -> tuple[type, type]:
    import mlx.core as mx
    import mlx.nn as nn

    class ZeroEmbedding(nn.Module):
        """Stands in for an input embedding on ranks that receive their hidden state."""

        def __init__(self, dims: int, dtype: mx.Dtype) -> None:
            super().__init__()
            self._dims = dims
            self._dtype = dtype

        def __call__(self, inputs: mx.array) -> mx.array:
            return mx.zeros((*inputs.shape, self._dims), dtype=self._dtype)

        def as_linear(self, x: mx.array) -> mx.array:
            return x[..., :1]

    class Narrow(nn.Module):
        """Stands in for the final norm or LM head on ranks that do not produce logits."""

        def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
            return x[..., :1]

    return ZeroEmbedding, Narrow


def split_pipeline(model: nn.Module, stage: StageSpec, group: mx.distributed.Group) -> None:
    """Cut `model` down to this rank's stage, in place, before any weight is evaluated."""
    import mlx.core as mx

    stage.check()
    ZeroEmbedding, Narrow = _stubs()
    owner, key = find_layers(model)
    layers = list(owner[key])
    if len(layers) != stage.n_layers:
        raise ValueError(f"the model has {len(layers)} layers, the shard says {stage.n_layers}")
    kept = layers[stage.start_layer : stage.end_layer]
    owner[key] = kept
    embed_name = _first_named(owner, EMBED_NAMES)
    head_name = _first_named(model, HEAD_NAMES)
    norm_name = _first_named(owner, NORM_NAMES)
    tied = head_name is None
    if embed_name is None:
        raise ValueError(f"{type(model).__name__}: no input embedding found among {EMBED_NAMES}")
    embedding = owner[embed_name]
    dims = _hidden_size(model, embedding)
    dtype = _embedding_dtype(embedding)

    if not stage.first:
        prev = stage.rank - 1

        base_first = type(kept[0])

        def receive(self: Any, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
            x = mx.distributed.recv_like(x, prev, group=group)
            return base_first.__call__(self, x, *args, **kwargs)

        _retype(kept[0], "Receiving", {"__call__": receive})
    if not stage.last:
        nxt = stage.rank + 1

        base_last = type(kept[-1])

        def send(self: Any, *args: Any, **kwargs: Any) -> mx.array:
            out = base_last.__call__(self, *args, **kwargs)
            return mx.depends(out, mx.distributed.send(out, nxt, group=group))

        _retype(kept[-1], "Sending", {"__call__": send})
        if norm_name is not None:
            owner[norm_name] = Narrow()
        if head_name is not None:
            model[head_name] = Narrow()

    if stage.first and not stage.last and tied:
        _retype(embedding, "InputOnly", {"as_linear": lambda self, x: x[..., :1]})
    elif not stage.first:
        if tied and stage.last:
            zero = ZeroEmbedding(dims, dtype)
            _retype(embedding, "OutputOnly", {"__call__": lambda self, inputs: zero(inputs)})
        else:
            owner[embed_name] = ZeroEmbedding(dims, dtype)


def _hidden_size(model: Any, embedding: Any) -> int:
    size = getattr(getattr(model, "args", None), "hidden_size", None)
    if isinstance(size, int):
        return size
    if "scales" not in embedding:
        return int(embedding.weight.shape[-1])
    raise ValueError(f"{type(model).__name__}: cannot tell the hidden size of a quantized embedding")


def shard_tensor(model: nn.Module, group: mx.distributed.Group) -> None:
    """Tensor-parallel sharding through mlx-lm's own ``model.shard(group)``."""
    shard = getattr(model, "shard", None)
    if not callable(shard):
        raise ValueError(f"mlx-lm has no tensor sharding for {type(model).__name__}; place it as Pipeline")
    args = getattr(model, "args", None)
    size = group.size()
    for field in ("num_attention_heads", "num_key_value_heads"):
        value = getattr(args, field, None)
        if isinstance(value, int) and value % size:
            raise ValueError(f"{field}={value} is not divisible by a {size}-way tensor split")
    shard(group)
