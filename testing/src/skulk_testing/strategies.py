"""Hypothesis strategies for any pydantic model or type annotation, Skulk's wire types first.

`strategy_for(tp)` walks a type annotation (or a pydantic model's `model_fields`) and builds a
strategy whose values validate: typed string ids (NewType), ints, finite floats, bools, UTC
datetimes, Literal, Optional/Union, tuples, dicts, Any (small JSON values), nested models and the
tagged unions built by `skulk_kernel.wire.tagged_union`. Field constraints (``ge``, ``gt``, ``le``,
``lt``, ``min_length``, ``max_length``) are respected so generated models construct.

    from skulk_testing.strategies import StrategyBuilder, strategy_for
    from skulk_kernel.api import Event

    events = strategy_for(Event)                       # any event, every member reachable

    # A small id pool makes generated events refer to each other (deletes hit creates):
    pooled = StrategyBuilder(ids=["a", "b", "c"])
    log = st.lists(pooled.strategy_for(Event), max_size=30)

Plugins can reuse the builder for their own wire types (`builder.register(MyType, strategy)`).
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import annotated_types as at
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = [
    "StrategyBuilder",
    "events",
    "indexed_logs",
    "json_values",
    "strategy_for",
    "union_members",
]

UTC = dt.UTC
INT_BOUND = 2**62  # inside msgpack's int64 and every JSON parser's comfort zone
_NONE_TYPE = type(None)


@dataclass(frozen=True)
class Bounds:
    """The constraints collected from Field(...) / Annotated metadata on one type."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    min_length: int | None = None
    max_length: int | None = None

    def merged(self, metadata: Iterable[Any]) -> Bounds:
        values = dict(self.__dict__)
        for item in metadata:
            if isinstance(item, FieldInfo):  # Annotated[int, Field(ge=0)]
                nested = Bounds().merged(item.metadata).__dict__
                values.update({k: v for k, v in nested.items() if v is not None})
                continue
            if isinstance(item, at.Interval):
                for key in ("ge", "gt", "le", "lt"):
                    if getattr(item, key) is not None:
                        values[key] = getattr(item, key)
            elif isinstance(item, at.Len):
                values["min_length"] = item.min_length
                values["max_length"] = item.max_length
            for key, kind in (
                ("ge", at.Ge),
                ("gt", at.Gt),
                ("le", at.Le),
                ("lt", at.Lt),
                ("min_length", at.MinLen),
                ("max_length", at.MaxLen),
            ):
                if isinstance(item, kind):
                    values[key] = getattr(item, key)
        return Bounds(**values)


def union_members(tp: Any) -> tuple[Any, ...]:
    """The member types of a Union / Optional / tagged union, with Annotated wrappers removed."""
    tp = _strip_annotated(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(_strip_annotated(arg)[0] for arg in typing.get_args(tp))
    return (tp,)


def _strip_annotated(tp: Any) -> tuple[Any, list[Any]]:
    metadata: list[Any] = []
    while typing.get_origin(tp) is typing.Annotated:
        tp, *extra = typing.get_args(tp)
        metadata.extend(extra)
    return tp, metadata


def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    """Small JSON documents (what an `Any` field may carry and still round-trip everywhere)."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-INT_BOUND, INT_BOUND),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.text(max_size=8), inner, max_size=3),
        ),
        max_leaves=max_leaves,
    )


class StrategyBuilder:
    """Builds (and caches) a strategy per type annotation.

    ids: a pool of strings every NewType id draws from (None: arbitrary short text). A small pool
    makes generated events collide on purpose, so deletes and updates hit existing entries.
    max_size: the largest tuple/list/dict generated anywhere (keeps examples fast).
    """

    def __init__(
        self,
        *,
        ids: Sequence[str] | None = None,
        max_size: int = 3,
        text: st.SearchStrategy[str] | None = None,
        datetimes: st.SearchStrategy[dt.datetime] | None = None,
    ) -> None:
        self.max_size = max_size
        self._text = text if text is not None else st.text(max_size=12)
        self._ids = st.sampled_from(list(ids)) if ids else st.text(min_size=1, max_size=10)
        self._datetimes = (
            datetimes
            if datetimes is not None
            else st.datetimes(
                min_value=dt.datetime(2000, 1, 1),
                max_value=dt.datetime(2100, 1, 1),
                timezones=st.just(UTC),
            )
        )
        self._registered: dict[Any, st.SearchStrategy[Any]] = {}
        self._models: dict[type[BaseModel], st.SearchStrategy[Any]] = {}

    # ---------------------------------------------------------------- public

    def register(self, tp: Any, strategy: st.SearchStrategy[Any]) -> None:
        """Use `strategy` whenever `tp` (a class, NewType or any annotation) appears."""
        self._registered[tp] = strategy

    def strategy_for(self, tp: Any, metadata: Iterable[Any] = ()) -> st.SearchStrategy[Any]:
        """A strategy of values valid for the annotation `tp` (with constraint `metadata`)."""
        return self._build(tp, Bounds().merged(metadata))

    def model(self, cls: type[BaseModel], **overrides: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        """Instances of `cls`; `overrides` replace the strategy of named fields.

        Fields with a default are sometimes left out, so defaults are exercised too.
        """
        if not overrides and cls in self._models:
            return self._models[cls]
        if not overrides:
            # deferred: a model that (indirectly) contains itself still builds
            self._models[cls] = st.deferred(lambda: self._model_now(cls, {}))
            return self._models[cls]
        return self._model_now(cls, overrides)

    # ---------------------------------------------------------------- internals

    def _model_now(self, cls: type[BaseModel], overrides: Mapping[str, st.SearchStrategy[Any]]) -> Any:
        required: dict[str, st.SearchStrategy[Any]] = {}
        optional: dict[str, st.SearchStrategy[Any]] = {}
        for name, info in cls.model_fields.items():
            if name in overrides:
                strategy = overrides[name]
            else:
                strategy = self._build(info.annotation, Bounds().merged(info.metadata))
            (required if info.is_required() or name in overrides else optional)[name] = strategy
        return st.fixed_dictionaries(required, optional=optional).map(lambda kw: cls(**kw))

    def _build(self, tp: Any, bounds: Bounds) -> st.SearchStrategy[Any]:
        tp, metadata = _strip_annotated(tp)
        if metadata:
            bounds = bounds.merged(metadata)
        if tp in self._registered:
            return self._registered[tp]
        if isinstance(tp, typing.NewType):
            return self._ids if tp.__supertype__ is str else self._build(tp.__supertype__, bounds)
        if tp is Any or tp is object:
            return json_values()
        if tp is _NONE_TYPE or tp is None:
            return st.none()
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Literal:
            return st.sampled_from(args)
        if origin in (typing.Union, types.UnionType):
            return st.one_of(*(self._build(arg, bounds) for arg in args))
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return self._sized(st.lists, self._build(args[0], Bounds()), bounds).map(tuple)
            if args == ((),) or not args:
                return st.just(())
            return st.tuples(*(self._build(arg, Bounds()) for arg in args))
        if origin in (list, Sequence, typing.Sequence):
            return self._sized(st.lists, self._build(args[0] if args else Any, Bounds()), bounds)
        if origin in (set, frozenset):
            elements = self._build(args[0] if args else str, Bounds())
            return self._sized(st.frozensets, elements, bounds).map(origin)
        if origin in (dict, Mapping, typing.Mapping):
            key_tp, value_tp = args if args else (str, Any)
            keys, values = self._build(key_tp, Bounds()), self._build(value_tp, Bounds())
            lo, hi = self._size_range(bounds)
            return st.dictionaries(keys, values, min_size=lo, max_size=hi)
        if isinstance(tp, type):
            return self._build_class(tp, bounds)
        raise TypeError(
            f"skulk_testing.strategies cannot build values for {tp!r}; register one with StrategyBuilder.register()"
        )

    def _build_class(self, tp: type, bounds: Bounds) -> st.SearchStrategy[Any]:
        if issubclass(tp, BaseModel):
            return self.model(tp)
        if issubclass(tp, enum.Enum):
            return st.sampled_from(list(tp))
        if tp is bool:
            return st.booleans()
        if tp is int:
            lo = _int_bound(bounds.ge, bounds.gt, +1, -INT_BOUND)
            hi = _int_bound(bounds.le, bounds.lt, -1, INT_BOUND)
            return st.integers(lo, hi)
        if tp is float:
            return st.floats(
                min_value=bounds.ge if bounds.ge is not None else bounds.gt,
                max_value=bounds.le if bounds.le is not None else bounds.lt,
                exclude_min=bounds.ge is None and bounds.gt is not None,
                exclude_max=bounds.le is None and bounds.lt is not None,
                allow_nan=False,
                allow_infinity=False,
            )
        if tp is str:
            if bounds.min_length or bounds.max_length is not None:
                lo, hi = self._size_range(bounds, default_max=12)
                return st.text(min_size=lo, max_size=hi)
            return self._text
        if tp is bytes:
            return st.binary(max_size=16)
        if tp is dt.datetime:
            return self._datetimes
        if tp is dt.date:
            return st.dates()
        raise TypeError(
            f"skulk_testing.strategies cannot build values for {tp!r}; register one with StrategyBuilder.register()"
        )

    def _size_range(self, bounds: Bounds, default_max: int | None = None) -> tuple[int, int]:
        lo = bounds.min_length or 0
        hi = bounds.max_length if bounds.max_length is not None else max(lo, default_max or self.max_size)
        return lo, min(hi, lo + (default_max or self.max_size))

    def _sized(
        self, kind: Callable[..., st.SearchStrategy[Any]], elements: st.SearchStrategy[Any], bounds: Bounds
    ) -> st.SearchStrategy[Any]:
        lo, hi = self._size_range(bounds)
        return kind(elements, min_size=lo, max_size=hi)


def _int_bound(inclusive: float | None, exclusive: float | None, step: int, default: int) -> int:
    if inclusive is not None:
        return int(math.ceil(inclusive) if step > 0 else math.floor(inclusive))
    if exclusive is not None:
        return int(math.floor(exclusive) + 1 if step > 0 else math.ceil(exclusive) - 1)
    return default


_DEFAULT = StrategyBuilder()


def strategy_for(tp: Any, metadata: Iterable[Any] = ()) -> st.SearchStrategy[Any]:
    """Values valid for the annotation `tp` (a model, a tagged union, any supported type)."""
    return _DEFAULT.strategy_for(tp, metadata)


def events(builder: StrategyBuilder | None = None) -> st.SearchStrategy[Any]:
    """Any kernel Event (every member of `skulk_kernel.events.Event` is reachable)."""
    from skulk_kernel.api import Event

    return (builder or _DEFAULT).strategy_for(Event)


@st.composite
def indexed_logs(
    draw: st.DrawFn,
    builder: StrategyBuilder | None = None,
    max_size: int = 15,
    origins: Sequence[str] = ("node-a", "node-b"),
) -> list[Any]:
    """A well-formed log: IndexedEvents with idx 0..n-1 and non-decreasing timestamps."""
    from skulk_kernel.api import IndexedEvent

    builder = builder or StrategyBuilder(ids=["a", "b", "c"])
    evs = draw(st.lists(events(builder), max_size=max_size))
    start = draw(
        st.datetimes(min_value=dt.datetime(2020, 1, 1), max_value=dt.datetime(2030, 1, 1), timezones=st.just(UTC))
    )
    log = []
    for idx, event in enumerate(evs):
        at_ = start + dt.timedelta(milliseconds=draw(st.integers(0, 5000)) + idx)
        log.append(IndexedEvent(idx=idx, origin=draw(st.sampled_from(list(origins))), at=at_, event=event))
    return log
