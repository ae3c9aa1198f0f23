"""The batch input file: JSONL in OpenAI's request shape, parsed and bounded, before anything runs.

Pure: bytes in, lines out. What the whole file gets wrong (not UTF-8, no request, too many, a
custom_id used twice) fails the batch, as OpenAI's validation does; what one line gets wrong (not
JSON, not an object, an unknown url, no body) is that line's entry in the error file, and the
batch goes on. Parsing is deterministic, so a node that continues a batch parses the same lines
with the same indices as the node that started it: the index is the line's identity.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from .config import ENDPOINTS


class InputLine(BaseModel):
    """One request to run: its index in the file (blank lines are not counted) and its parts."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    index: int
    custom_id: str
    url: str
    body: dict[str, Any]


class LineError(BaseModel):
    """One line that cannot run: it goes to the error file with this code and message."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    index: int
    custom_id: str | None
    code: str
    message: str


class FileError(BaseModel):
    """What fails the whole batch, in the shape of OpenAI's `errors.data[]`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    code: str
    message: str
    line: int | None = None
    param: str | None = None


class ParsedInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    lines: list[InputLine | LineError]
    fatal: list[FileError]

    @property
    def total(self) -> int:
        return len(self.lines)


def parse_line(index: int, raw: str, max_line_bytes: int) -> InputLine | LineError:
    """One non-blank line: a runnable request or the reason it is not one."""
    if len(raw.encode()) > max_line_bytes:
        return LineError(
            index=index, custom_id=None, code="line_too_long", message=f"line longer than {max_line_bytes} bytes"
        )
    try:
        item = json.loads(raw)
    except ValueError as exc:
        return LineError(index=index, custom_id=None, code="invalid_json", message=f"line is not JSON: {exc}")
    if not isinstance(item, dict):
        return LineError(index=index, custom_id=None, code="invalid_line", message="line must be a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(
            index=index, custom_id=None, code="missing_custom_id", message="line needs a non-empty string custom_id"
        )
    method = item.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        return LineError(index=index, custom_id=custom_id, code="invalid_method", message="method must be POST")
    url = item.get("url")
    if url not in ENDPOINTS:
        return LineError(
            index=index,
            custom_id=custom_id,
            code="invalid_url",
            message=f"url {url!r} is not one a batch can call: use one of {', '.join(ENDPOINTS)}",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return LineError(index=index, custom_id=custom_id, code="invalid_body", message="body must be a JSON object")
    if not isinstance(body.get("model"), str):
        return LineError(
            index=index, custom_id=custom_id, code="invalid_body", message="body.model must name a model (a string)"
        )
    return InputLine(index=index, custom_id=custom_id, url=str(url), body=body)


def parse_input(data: bytes, *, max_lines: int, max_line_bytes: int) -> ParsedInput:
    """Every request of an input file, or the reasons the file cannot be a batch at all."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ParsedInput(lines=[], fatal=[FileError(code="invalid_file", message=f"file is not UTF-8: {exc}")])
    raws = [line for line in text.splitlines() if line.strip()]
    if not raws:
        return ParsedInput(lines=[], fatal=[FileError(code="empty_file", message="file holds no request line")])
    if len(raws) > max_lines:
        message = f"file holds {len(raws)} requests; a batch takes at most {max_lines}: split it"
        return ParsedInput(lines=[], fatal=[FileError(code="too_many_requests", message=message)])
    lines = [parse_line(i, raw, max_line_bytes) for i, raw in enumerate(raws)]
    seen: dict[str, int] = {}
    fatal: list[FileError] = []
    for line in lines:
        if line.custom_id is None:
            continue
        if line.custom_id in seen:
            fatal.append(
                FileError(
                    code="duplicate_custom_id",
                    message=f"custom_id {line.custom_id!r} is used by lines {seen[line.custom_id] + 1} and "
                    f"{line.index + 1}: each request needs its own",
                    line=line.index + 1,
                    param="custom_id",
                )
            )
        else:
            seen[line.custom_id] = line.index
    if fatal:
        return ParsedInput(lines=[], fatal=fatal[:100])
    return ParsedInput(lines=lines, fatal=[])
