"""ComfyUI's HTTP and WebSocket protocol, as the runner uses it (synchronous: it runs in a task thread).

    POST /prompt {"prompt": graph, "client_id": id, "prompt_id": id}  -> {"prompt_id", "number", "node_errors"}
                                                  (400 with "error" and "node_errors" when it is refused)
    WS   /ws?clientId=id     JSON messages {"type", "data"}: status, execution_start, execution_cached,
                             executing, progress {value, max, node}, progress_state, executed,
                             execution_success, execution_error, execution_interrupted (binary
                             frames are previews: ignored)
    GET  /history/{id}       {id: {"outputs": {node: {"images"|"videos"|"gifs": [{filename, subfolder, type}]}}}}
    GET  /view?filename=&subfolder=&type=   the file
    POST /interrupt          stop the running prompt

`follow()` yields this prompt's events as typed `Event`s; messages about another client's prompt
(someone using the ComfyUI frontend on the same server) are skipped.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class ComfyError(RuntimeError):
    """The server refused or failed the prompt; `message` is what to show the user."""


class ComfyGone(ComfyError):
    """The connection to the server broke (it may have died)."""


@dataclass
class Event:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Output:
    filename: str
    subfolder: str
    type: str


class ComfyClient:
    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.client_id = uuid.uuid4().hex
        # loopback only: never through a proxy from the environment
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, trust_env=False)
        self.ws: Any = None
        self._stack = contextlib.ExitStack()

    def connect(self) -> None:
        """Open the WebSocket first, so no event of the prompt about to be queued is missed."""
        from websockets.sync.client import connect

        url = self.base_url.replace("http://", "ws://", 1) + f"/ws?clientId={self.client_id}"
        try:
            self.ws = self._stack.enter_context(connect(url, open_timeout=10, max_size=64 * 1024 * 1024, proxy=None))
        except OSError as exc:
            raise ComfyGone(f"cannot reach ComfyUI's WebSocket at {url}: {exc}") from None

    def queue(self, graph: dict[str, Any]) -> str:
        import httpx

        prompt_id = uuid.uuid4().hex
        body = {"prompt": graph, "client_id": self.client_id, "prompt_id": prompt_id}
        try:
            reply = self.http.post("/prompt", json=body)
        except httpx.HTTPError as exc:
            raise ComfyGone(f"ComfyUI did not take the prompt: {exc}") from None
        if reply.status_code != 200:
            raise ComfyError(f"ComfyUI refused the workflow: {_refusal(reply)}")
        return str(reply.json().get("prompt_id") or prompt_id)

    def follow(self, prompt_id: str, poll_s: float = 0.25) -> Iterator[Event | None]:
        """This prompt's events; None every `poll_s` of silence (so the caller can check cancel)."""
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                raw = self.ws.recv(timeout=poll_s)
            except TimeoutError:
                yield None
                continue
            except (ConnectionClosed, OSError) as exc:
                raise ComfyGone(f"ComfyUI's WebSocket closed: {exc}") from None
            if isinstance(raw, bytes):
                continue  # a preview image
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            kind = str(message.get("type", ""))
            data = message.get("data") or {}
            if not isinstance(data, dict):
                continue
            owner = data.get("prompt_id")
            if owner is not None and owner != prompt_id:
                continue
            yield Event(kind, data)

    def interrupt(self, prompt_id: str) -> None:
        import httpx

        try:
            self.http.post("/interrupt", json={"prompt_id": prompt_id})
        except httpx.HTTPError:
            pass  # the server is gone: nothing left to interrupt

    def outputs(self, prompt_id: str) -> list[Output]:
        reply = self.http.get(f"/history/{prompt_id}")
        reply.raise_for_status()
        entry = reply.json().get(prompt_id) or {}
        found: list[Output] = []
        for node_output in (entry.get("outputs") or {}).values():
            for key in ("videos", "images", "gifs"):
                for item in node_output.get(key) or []:
                    if isinstance(item, dict) and item.get("filename"):
                        found.append(
                            Output(str(item["filename"]), str(item.get("subfolder", "")), str(item.get("type", "")))
                        )
        return found

    def fetch(self, output: Output) -> bytes:
        params = {"filename": output.filename, "subfolder": output.subfolder, "type": output.type or "output"}
        reply = self.http.get("/view", params=params)
        reply.raise_for_status()
        return bytes(reply.content)

    def upload_input(self, name: str, data: bytes) -> str:
        """Put an input image in ComfyUI's input folder via POST /upload/image; the name to bind."""
        reply = self.http.post(
            "/upload/image", files={"image": (name, data, "application/octet-stream")}, data={"overwrite": "true"}
        )
        reply.raise_for_status()
        return str(reply.json().get("name") or name)

    def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):  # closing a broken socket
                self._stack.close()
            self.ws = None
        self.http.close()


def _refusal(reply: Any) -> str:
    try:
        body = reply.json()
    except ValueError:
        return f"HTTP {reply.status_code}: {reply.text[:300]}"
    error = body.get("error") or {}
    parts = [str(error.get("message") or error) if error else f"HTTP {reply.status_code}"]
    for node_id, problem in (body.get("node_errors") or {}).items():
        for item in problem.get("errors", []) if isinstance(problem, dict) else []:
            parts.append(
                f"node {node_id} ({problem.get('class_type', '?')}): {item.get('message')} {item.get('details', '')}"
            )
    return "; ".join(p.strip() for p in parts)
