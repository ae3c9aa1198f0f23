"""`node.services`: typed per-node objects under identity-compared keys, and no `extensions` left.

The string-keyed ``node.extensions`` dict hid every cross-plugin use from mypy and the import
graph; the last test keeps it from coming back.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import assert_type

import pytest

from skulk_kernel.api import NodeError, ServiceKey, Services

ROOT = Path(__file__).resolve().parents[2]


class Meter:
    def __init__(self) -> None:
        self.count = 0


METER: ServiceKey[Meter] = ServiceKey("api-control.meter")


def test_publish_get_require_withdraw() -> None:
    services = Services()
    assert services.get(METER) is None and METER not in services and len(services) == 0
    meter = services.publish(METER, Meter())
    assert METER in services and len(services) == 1
    assert services.get(METER) is meter and services.require(METER) is meter
    assert services.withdraw(METER) is meter
    assert services.withdraw(METER) is None and services.get(METER) is None
    services.publish(METER, Meter())  # withdrawn, so publishable again


def test_lookups_are_typed_by_the_key() -> None:
    services = Services()
    services.publish(METER, Meter())
    assert_type(services.get(METER), Meter | None)  # checked by mypy (see the next test)
    assert_type(services.require(METER), Meter)
    assert_type(services.withdraw(METER), Meter | None)


def test_mypy_infers_the_keys_type(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    source = tmp_path / "uses_services.py"
    source.write_text(
        textwrap.dedent(
            """
            from skulk_kernel.api import ServiceKey, Services

            COUNT: ServiceKey[int] = ServiceKey("count")
            services = Services()
            services.publish(COUNT, 1)
            reveal_type(services.get(COUNT))
            reveal_type(services.require(COUNT))
            services.publish(COUNT, "one")
            """
        )
    )
    out, _, _ = api.run([str(source), "--no-incremental", "--follow-imports=silent", "--cache-dir=/dev/null"])
    assert re.search(r':7: note: Revealed type is "(builtins\.)?int \| None"', out), out
    assert re.search(r':8: note: Revealed type is "(builtins\.)?int"', out), out
    assert re.search(r":9: error: .*publish", out), out  # a str under an int key is refused


def test_a_second_publisher_is_refused_naming_the_service() -> None:
    services = Services()
    first = services.publish(METER, Meter())
    with pytest.raises(NodeError, match=r"'api-control.meter' is already published.*'api-control'"):
        services.publish(METER, Meter())
    assert services.get(METER) is first


def test_require_names_the_plugin_that_must_be_loaded() -> None:
    with pytest.raises(LookupError, match=r"no 'worker' service on this node: the 'worker' plugin publishes it"):
        Services().require(ServiceKey("worker"))
    key: ServiceKey[int] = ServiceKey("peers", plugin="store")
    with pytest.raises(LookupError, match="'store' plugin"):
        Services().require(key)


def test_keys_compare_by_identity_not_name() -> None:
    services = Services()
    services.publish(METER, Meter())
    impostor: ServiceKey[Meter] = ServiceKey(METER.name)
    assert impostor not in services and services.get(impostor) is None
    services.publish(impostor, Meter())  # a different service, though it reads the same
    assert services.get(impostor) is not services.get(METER)
    assert repr(METER) == "ServiceKey('api-control.meter')"


SOURCES = [
    *(ROOT / "kernel" / "src").rglob("*.py"),
    *(ROOT / "testing" / "src").rglob("*.py"),
    *(ROOT / "plugins").glob("*/src/**/*.py"),
    *(ROOT / "plugins").glob("*/tests/**/*.py"),
    *(ROOT / "kernel" / "tests").glob("*.py"),
    *(p for p in (ROOT / "tests").rglob("*.py") if "node_modules" not in p.parts),
]
# the node's old string-keyed dict (`node.extensions[...]`, `getattr(node, "extensions")`), not the
# providers plugin's out-of-tree extensions (`skulk.extensions`, `config.extensions`)
EXTENSIONS_USE = re.compile(r"\b(node|self\.node|surface)\.extensions\b|getattr\(\w+, [\"']extensions[\"']")


def test_no_node_extensions_left() -> None:
    assert len(SOURCES) > 100
    here = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in SOURCES
        if path.resolve() != here
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if EXTENSIONS_USE.search(line)
    ]
    assert not found, "node.extensions is gone: publish a ServiceKey on node.services instead\n" + "\n".join(found)


def test_the_node_has_services_and_no_extensions() -> None:
    from skulk_kernel.api import NodeSurface

    assert "services" in NodeSurface.__annotations__ and "extensions" not in NodeSurface.__annotations__
