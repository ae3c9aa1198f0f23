"""The OpenAI error contract every 4xx of this plugin must meet (shared by the Chat and Responses suites)."""

from __future__ import annotations

from typing import Any


def assert_openai_error(r: Any, status: int, param: str | None = None, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["x-should-retry"] == "false"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
