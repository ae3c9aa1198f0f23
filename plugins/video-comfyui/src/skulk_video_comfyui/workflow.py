"""A card's ComfyUI workflow graph (API format) bound with one job's inputs.

The graph is a JSON template in ComfyUI's API format (`{"<node id>": {"class_type": ..., "inputs":
{...}}}`) with placeholders: a string value that is exactly `"{{name}}"` becomes the value itself
(an int stays an int, so `"steps": "{{steps}}"` binds to `8`), a placeholder inside a longer string
is substituted as text (`"skulk/{{job}}"`). The names are the resolved request: `prompt`,
`negative_prompt`, `width`, `height`, `frames`, `fps`, `seconds`, `steps`, `seed`, `color` (the seed
as a 24-bit colour), `image` (the input image's file name in ComfyUI's input folder, i2v only) and
`prefix` (where SaveVideo writes).
A placeholder the job does not supply is an error naming it, never a graph sent half bound.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


class WorkflowError(ValueError):
    """The template is unusable, or a placeholder has no value."""


def load_template(section: dict[str, Any], base: Path | None) -> dict[str, Any]:
    """The card's graph: `workflow` inline, or `workflow_file` (relative to the card's folder, or a
    file bundled in this package's `workflows/`)."""
    inline = section.get("workflow")
    if isinstance(inline, dict):
        return inline
    name = section.get("workflow_file")
    if not isinstance(name, str) or not name:
        raise WorkflowError("the card's [video] section has neither 'workflow' nor 'workflow_file'")
    candidates = [base / name] if base is not None else []
    candidates.append(Path(__file__).with_name("workflows") / name)
    for path in candidates:
        if path.is_file():
            graph = json.loads(path.read_text())
            if not isinstance(graph, dict):
                raise WorkflowError(f"{path} is not a ComfyUI API-format graph (a JSON object of nodes)")
            return graph
    raise WorkflowError(f"workflow file {name!r} not found (looked in {', '.join(str(p) for p in candidates)})")


def placeholders(template: dict[str, Any]) -> set[str]:
    return set(PLACEHOLDER.findall(json.dumps(template)))


def bind(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of the graph with every placeholder replaced; WorkflowError if one has no value."""
    unbound = sorted(name for name in placeholders(template) if values.get(name) is None)
    if unbound:
        raise WorkflowError(f"the workflow needs {', '.join(unbound)}, which this request does not supply")

    def visit(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: visit(v) for k, v in value.items()}
        if isinstance(value, list):
            return [visit(v) for v in value]
        if isinstance(value, str):
            whole = PLACEHOLDER.fullmatch(value.strip())
            if whole:
                return values[whole.group(1)]
            return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), value)
        return value

    graph = visit(copy.deepcopy(template))
    for node_id, node in graph.items():
        if not isinstance(node, dict) or "class_type" not in node or not isinstance(node.get("inputs", {}), dict):
            raise WorkflowError(f"node {node_id!r} of the workflow has no class_type/inputs: not an API-format graph")
    return graph
