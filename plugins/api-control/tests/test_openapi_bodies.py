"""Declared request bodies (openapi_body.py) and the input checks schemathesis led to."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from skulk_api_control.control_bodies import PlaceInstanceBody
from skulk_api_control.hardening import oversized_integer
from skulk_api_control.openapi_body import body_schema, model_schema
from skulk_api_control.reference_wire import instance_meta_error


class Leaf(BaseModel):
    x: int


class Tree(BaseModel):
    leaf: Leaf
    children: list[Tree] = []


def test_nested_models_are_inlined_and_a_cycle_is_cut() -> None:
    schema = model_schema(Tree)
    assert "$defs" not in schema and "$ref" not in str(schema)
    assert schema["properties"]["leaf"]["properties"]["x"]["type"] == "integer"
    assert schema["properties"]["children"]["items"] == {}  # Tree inside Tree: any value


def test_the_body_is_json_and_required() -> None:
    body: dict[str, Any] = body_schema(PlaceInstanceBody)["requestBody"]
    assert body["required"] is True
    assert "model_id" in body["content"]["application/json"]["schema"]["required"]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (b'{"seed": 100000000000000000000000}', b"100000000000000000000000"),
        (b'{"seed": -9223372036854775809}', b"-9223372036854775809"),
        (b'{"seed": 9223372036854775807}', None),  # the largest signed 64-bit integer
        (b'{"seed": "100000000000000000000000"}', None),  # a string, not a number
        (b'{"x": 100000000000000000000000.5, "y": 1e400}', None),  # floats: JSON numbers Python reads
    ],
)
def test_integers_beyond_64_bits_are_found(text: bytes, found: bytes | None) -> None:
    assert oversized_integer(text) == found


@pytest.mark.parametrize("meta", [{}, [], 3])
def test_an_instance_meta_that_is_no_name_is_refused_not_raised(meta: Any) -> None:
    assert "instance_meta must be one of" in (instance_meta_error(meta) or "")
