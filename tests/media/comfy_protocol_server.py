"""A loopback server that speaks ComfyUI's HTTP and WebSocket protocol, for the ComfyUI runner tests.

ComfyUI is in no package registry here, so the runner's client code is tested against this
server, run as a real subprocess the way the engine runs ComfyUI (`server_command`). It follows
the protocol as observed on ComfyUI 0.3.64 (FACTS.md): POST /prompt answers a prompt id, or 400
with `node_errors` when the graph does not validate; WS /ws?clientId= sends status,
execution_start, execution_cached, executing, progress, executed and execution_success (or
execution_error / execution_interrupted); GET /history/{id}; GET /view; POST /interrupt;
GET /system_stats.

It checks the submitted graph like ComfyUI does (every node's class_type must be one it knows,
required inputs present and of the right type, links must point at nodes that exist) and refuses
anything with an unbound `{{placeholder}}`. It executes the weight-free nodes for real:
EmptyImage's canvas and batch size become an MP4 (PyAV) written under the output directory, so a
test can check the frame count and size the graph asked for. Every accepted graph is saved to
`--record` for the test to read. `--crash-at-step N` makes the process exit hard in the middle of
sampling (a crash on demand); `--steps`/`--step-seconds` set the length of the fake sampling.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

NODES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "EmptyImage": {"width": int, "height": int, "batch_size": int, "color": int},
    "ImageInvert": {"image": list},
    "CreateVideo": {"images": list, "fps": (int, float)},
    "SaveVideo": {"video": list, "filename_prefix": str, "format": str, "codec": str},
    "LoadImage": {"image": str},
}


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.output = Path(args.output_dir)
        self.input = Path(args.input_dir)
        self.record = Path(args.record) if args.record else None
        self.sockets: dict[str, WebSocket] = {}
        self.history: dict[str, dict[str, Any]] = {}
        self.queue: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()
        self.interrupted = False
        self.number = 0

    async def send(self, client_id: str, kind: str, data: dict[str, Any]) -> None:
        socket = self.sockets.get(client_id)
        if socket is not None:
            try:
                await socket.send_text(json.dumps({"type": kind, "data": data}))
            except Exception:
                self.sockets.pop(client_id, None)

    def validate(self, graph: Any) -> dict[str, Any]:
        if not isinstance(graph, dict) or not graph:
            return {"_": {"errors": [{"message": "the prompt is not a graph"}], "class_type": "?"}}
        if "{{" in json.dumps(graph):
            return {"_": {"errors": [{"message": "unbound placeholder in the graph"}], "class_type": "?"}}
        errors: dict[str, Any] = {}
        for node_id, node in graph.items():
            kind = node.get("class_type") if isinstance(node, dict) else None
            found: list[dict[str, str]] = []
            if kind not in NODES:
                errors[node_id] = {"errors": [{"message": f"unknown node type {kind!r}"}], "class_type": kind}
                continue
            errors_here = {"errors": found, "class_type": kind}
            for name, want in NODES[kind].items():
                value = node.get("inputs", {}).get(name)
                if value is None or not isinstance(value, want) or isinstance(value, bool):
                    found.append({"message": "Required input is missing or of the wrong type", "details": name})
                elif isinstance(value, list) and (len(value) != 2 or str(value[0]) not in graph):
                    found.append({"message": "input links to a node that does not exist", "details": name})
            if found:
                errors[node_id] = errors_here
        return errors

    async def prompt(self, request: Request) -> Response:
        body = await request.json()
        graph = body.get("prompt")
        errors = self.validate(graph)
        if errors:
            error = {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation"}
            return JSONResponse({"error": error, "node_errors": errors}, status_code=400)
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        if self.record is not None:
            self.record.mkdir(parents=True, exist_ok=True)
            (self.record / f"{prompt_id}.json").write_text(json.dumps(body))
        self.number += 1
        await self.queue.put((prompt_id, str(body.get("client_id", "")), graph))
        return JSONResponse({"prompt_id": prompt_id, "number": self.number, "node_errors": {}})

    async def worker(self) -> None:
        while True:
            prompt_id, client, graph = await self.queue.get()
            self.interrupted = False
            try:
                await self.execute(prompt_id, client, graph)
            except Exception as exc:
                await self.send(
                    client,
                    "execution_error",
                    {"prompt_id": prompt_id, "node_id": "?", "node_type": "?", "exception_message": str(exc)},
                )

    async def execute(self, prompt_id: str, client: str, graph: dict[str, Any]) -> None:
        await self.send(client, "status", {"status": {"exec_info": {"queue_remaining": 1}}})
        await self.send(client, "execution_start", {"prompt_id": prompt_id, "timestamp": 0})
        await self.send(client, "execution_cached", {"prompt_id": prompt_id, "nodes": []})
        image = next((n for n in graph.values() if n["class_type"] == "EmptyImage"), None)
        create = next((n for n in graph.values() if n["class_type"] == "CreateVideo"), None)
        save_id, save = next(((k, n) for k, n in graph.items() if n["class_type"] == "SaveVideo"), (None, None))
        if image is None or create is None or save is None:
            raise ValueError("this server renders EmptyImage -> CreateVideo -> SaveVideo graphs only")
        for node_id in graph:
            await self.send(client, "executing", {"prompt_id": prompt_id, "node": node_id, "display_node": node_id})
            if graph[node_id]["class_type"] != "ImageInvert":
                continue
            for step in range(1, self.args.steps + 1):
                await asyncio.sleep(self.args.step_seconds)
                if self.interrupted:
                    data = {"prompt_id": prompt_id, "node_id": node_id, "node_type": "ImageInvert", "executed": []}
                    await self.send(client, "execution_interrupted", data)
                    return
                if step == self.args.crash_at_step:
                    print(f"crashing on demand at step {step}", file=sys.stderr, flush=True)
                    os._exit(17)
                data = {"prompt_id": prompt_id, "node": node_id, "value": step, "max": self.args.steps}
                await self.send(client, "progress", data)
        inputs = image["inputs"]
        prefix = str(save["inputs"]["filename_prefix"])
        subfolder, _, stem = prefix.rpartition("/")
        name = f"{stem}_00001_.mp4"
        folder = self.output / subfolder
        folder.mkdir(parents=True, exist_ok=True)
        data = await asyncio.to_thread(
            render, inputs["width"], inputs["height"], inputs["batch_size"], inputs["color"], create["inputs"]["fps"]
        )
        (folder / name).write_bytes(data)
        item = {"filename": name, "subfolder": subfolder, "type": "output"}
        output = {"images": [item], "animated": [True]}
        await self.send(client, "executed", {"prompt_id": prompt_id, "node": save_id, "output": output})
        self.history[prompt_id] = {
            "prompt": [self.number, prompt_id, graph, {}, [save_id]],
            "outputs": {save_id: output},
            "status": {"status_str": "success", "completed": True, "messages": []},
        }
        await self.send(client, "executing", {"prompt_id": prompt_id, "node": None})
        await self.send(client, "execution_success", {"prompt_id": prompt_id, "timestamp": 0})

    async def ws(self, socket: WebSocket) -> None:
        client = socket.query_params.get("clientId") or uuid.uuid4().hex
        await socket.accept()
        self.sockets[client] = socket
        await self.send(client, "status", {"status": {"exec_info": {"queue_remaining": 0}}, "sid": client})
        try:
            while True:
                await socket.receive_text()
        except WebSocketDisconnect:
            self.sockets.pop(client, None)

    async def get_history(self, request: Request) -> Response:
        prompt_id = request.path_params["prompt_id"]
        entry = self.history.get(prompt_id)
        return JSONResponse({prompt_id: entry} if entry else {})

    async def view(self, request: Request) -> Response:
        q = request.query_params
        base = {"output": self.output, "input": self.input}.get(q.get("type", "output"), self.output)
        path = (base / q.get("subfolder", "") / q.get("filename", "")).resolve()
        if not path.is_file() or base.resolve() not in path.parents:
            return Response(status_code=404)
        return Response(path.read_bytes(), media_type="video/mp4")

    async def interrupt(self, request: Request) -> Response:
        self.interrupted = True
        return Response(status_code=200)

    async def system_stats(self, request: Request) -> Response:
        return JSONResponse({"system": {"comfyui_version": "protocol-test", "argv": sys.argv}, "devices": []})


def render(width: int, height: int, frames: int, color: int, fps: float) -> bytes:
    """What EmptyImage -> ImageInvert -> CreateVideo -> SaveVideo makes: inverted solid frames as MP4."""
    import av
    import numpy as np

    rgb = np.array([(color >> 16) & 255, (color >> 8) & 255, color & 255], dtype=np.uint8)
    frame_array = np.broadcast_to(255 - rgb, (height, width, 3)).copy()
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=int(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_array, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--input-dir", required=True)
    parser.add_argument("--record", default="")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--crash-at-step", type=int, default=0)
    args = parser.parse_args()
    server = Server(args)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        task = asyncio.get_running_loop().create_task(server.worker())
        yield
        task.cancel()

    app = Starlette(
        routes=[
            Route("/prompt", server.prompt, methods=["POST"]),
            Route("/history/{prompt_id}", server.get_history),
            Route("/view", server.view),
            Route("/interrupt", server.interrupt, methods=["POST"]),
            Route("/system_stats", server.system_stats),
            WebSocketRoute("/ws", server.ws),
        ],
        lifespan=lifespan,
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
