"""The registry's client logic against real signed repositories served on loopback (seconds).

Repositories are made with the plugin's CLI (`registry init`, `registry sign`); the client is the
real `RegistryStore` with python-tuf's ngclient. Only the clock is the test's, to age a catalog.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError
from registry_tuf_helpers import (
    LoopbackServer,
    registry_cli,
    restore_repo,
    snapshot_repo,
    tamper_card,
    write_card,
)
from skulk_registry_tuf.cards import CardError, card_from_toml_text
from skulk_registry_tuf.plugin import RegistryConfig
from skulk_registry_tuf.service import RegistryStore
from skulk_testing.conformance import ModelStoreConformance, PluginConformance


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Registry:
    """A registry directory, its cards, its server and a store (the node's client) against it."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "registry"
        self.cards = tmp / "cards"
        self.tmp = tmp
        assert registry_cli("registry", "init", str(self.dir)) == 0
        self.root = self.dir / "repo" / "metadata" / "root.json"
        write_card(self.cards, "alpha")
        self.sign()
        self.server = LoopbackServer(self.dir / "repo").start()
        self.clock = Clock()
        self.health: dict[str, str] = {}

    def sign(self, *extra: str) -> None:
        assert registry_cli("registry", "sign", str(self.cards), str(self.dir), *extra) == 0

    def store(self, cache: str = "cache", **kwargs: object) -> RegistryStore:
        def sink(notes: dict[str, str]) -> None:
            self.health = notes

        return RegistryStore(
            self.server.url,
            self.root.read_bytes(),
            self.tmp / cache,
            refresh_interval_s=60,
            health=sink,
            clock=self.clock,
            **kwargs,  # type: ignore[arg-type]
        )

    def refresh(self, store: RegistryStore) -> None:
        self.clock.now += 61  # past the interval
        assert store.refresh()


@pytest.fixture
def reg(tmp_path: Path):
    made = Registry(tmp_path)
    try:
        yield made
    finally:
        made.server.stop()


class TestRegistryPlugin(PluginConformance):
    plugin_name = "registry-tuf"
    hook_owners = ("api-control",)  # it implements register_api_routes


class TestRegistryStore(ModelStoreConformance):
    @pytest.fixture
    def store(self, reg: Registry) -> RegistryStore:
        made = reg.store()
        made.refresh()
        assert made.catalog()
        return made


def test_card_parser_reads_the_store_bundled_cards_like_the_store() -> None:
    from importlib import resources

    from skulk_store.cards import card_from_toml

    entries = [e for e in (resources.files("skulk_store") / "cards").iterdir() if e.name.endswith(".toml")]
    assert entries
    for entry in entries:
        with resources.as_file(entry) as path:
            assert card_from_toml_text(path.read_text(), str(path)) == card_from_toml(path)
    with pytest.raises(CardError, match="unknown card fields"):
        card_from_toml_text('model_id = "x"\nn_layers = 1\nhidden_size = 1\nbogus = 3\n', "x.toml")


def test_valid_registry_adds_its_cards_and_refreshes_at_most_once_per_interval(reg: Registry) -> None:
    store = reg.store()
    assert store.catalog() == {}
    assert store.refresh()
    card = store.catalog()["registry-org/alpha"]
    assert card.sections["source"]["repo_id"] == "test-org/alpha"
    assert reg.health == {}
    served = len(reg.server.requests)
    reg.clock.now += 30
    assert not store.refresh()  # inside the interval: no request at all
    assert len(reg.server.requests) == served
    write_card(reg.cards, "beta")
    reg.sign()
    reg.refresh(store)
    assert sorted(store.catalog()) == ["registry-org/alpha", "registry-org/beta"]
    assert store.status()["version"] == 2


def test_tampered_target_is_refused_and_the_last_good_catalog_kept(reg: Registry) -> None:
    store = reg.store()
    store.refresh()
    write_card(reg.cards, "beta")
    reg.sign()
    tamper_card(reg.dir, "beta")
    reg.refresh(store)
    assert list(store.catalog()) == ["registry-org/alpha"]
    (code, message), *_ = reg.health.items()
    assert code == "registry_tampered"
    assert "does not match its signed hash" in message and "still using the last good catalog" in message


def test_expired_timestamp_is_refused(reg: Registry) -> None:
    store = reg.store()
    store.refresh()
    write_card(reg.cards, "beta")
    reg.sign("--timestamp-expires-in-s", "-60")
    reg.refresh(store)
    assert list(store.catalog()) == ["registry-org/alpha"]
    assert "registry_expired" in reg.health
    assert "timestamp.json is expired" in reg.health["registry_expired"]


def test_rolled_back_metadata_is_refused_even_by_a_restarted_node(reg: Registry) -> None:
    saved = snapshot_repo(reg.dir, reg.tmp / "v1")
    store = reg.store()
    write_card(reg.cards, "beta")
    reg.sign()
    store.refresh()
    assert len(store.catalog()) == 2
    restore_repo(saved, reg.dir)  # the server now offers version 1 again
    reg.refresh(store)
    assert "registry_rolled_back" in reg.health
    assert len(store.catalog()) == 2
    restarted = reg.store()  # same cache: the metadata it trusted survives the restart
    restarted.load_saved()
    assert restarted.refresh()
    assert "registry_rolled_back" in reg.health
    assert len(restarted.catalog()) == 2


def test_metadata_edited_without_its_key_is_refused(reg: Registry) -> None:
    store = reg.store()
    store.refresh()
    reg.sign()
    timestamp = reg.dir / "repo" / "metadata" / "timestamp.json"
    body = json.loads(timestamp.read_text())
    body["signed"]["version"] += 5
    timestamp.write_text(json.dumps(body))
    reg.refresh(store)
    assert "registry_unsigned" in reg.health
    assert list(store.catalog()) == ["registry-org/alpha"]


def test_unreachable_registry_keeps_the_last_good_catalog_for_its_age_limit(reg: Registry) -> None:
    store = reg.store()
    store.refresh()
    reg.server.stop()
    reg.refresh(store)
    assert "registry_unreachable" in reg.health
    assert list(store.catalog()) == ["registry-org/alpha"]
    # a node started while the registry is down serves the saved catalog, verified again offline
    restarted = reg.store()
    restarted.load_saved()
    assert list(restarted.catalog()) == ["registry-org/alpha"]
    reg.clock.now += 31 * 86400
    assert restarted.catalog() == {}
    restarted.refresh()
    assert "too old to use" in reg.health["registry_unreachable"]


def test_a_saved_catalog_edited_on_disk_is_not_served(reg: Registry) -> None:
    reg.store().refresh()
    saved = reg.tmp / "cache" / "last-good.json"
    body = json.loads(saved.read_text())
    import base64

    path = next(iter(body["cards"]))
    body["cards"][path] = base64.b64encode(b'model_id = "evil/x"\nn_layers = 1\nhidden_size = 1\n').decode()
    saved.write_text(json.dumps(body))
    restarted = reg.store()
    restarted.load_saved()
    assert restarted.catalog() == {}
    assert "registry_tampered" in reg.health


def test_offline_store_never_contacts_the_registry(reg: Registry) -> None:
    reg.store().refresh()
    before = len(reg.server.requests)
    offline = reg.store(offline=True)
    offline.load_saved()
    assert not offline.refresh(force=True)
    assert len(reg.server.requests) == before
    assert list(offline.catalog()) == ["registry-org/alpha"]
    assert "registry_offline" in reg.health


def test_cli_refusals_say_what_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cards, reg = tmp_path / "cards", tmp_path / "reg"
    write_card(cards, "ok")

    def refused(*argv: str) -> str:
        assert registry_cli("registry", *argv) == 2
        return capsys.readouterr().err

    assert "run `skulk-kernel registry init` first" in refused("sign", str(cards), str(reg))
    assert registry_cli("registry", "init", str(reg)) == 0
    assert "already holds a registry" in refused("init", str(reg))
    assert "holds no *.toml card files" in refused("sign", str(tmp_path / "reg" / "keys"), str(reg))
    (cards / "bad.toml").write_text("model_id = 'x'\n")
    assert "bad.toml" in refused("sign", str(cards), str(reg))
    (cards / "bad.toml").unlink()
    shutil.rmtree(reg / "keys")
    assert "targets.pem is missing" in refused("sign", str(cards), str(reg))


def test_config_needs_a_root_with_a_url() -> None:
    assert RegistryConfig().url is None
    with pytest.raises(ValidationError, match="root is not"):
        RegistryConfig(url="http://127.0.0.1:1")
    with pytest.raises(ValidationError, match="must start with http"):
        RegistryConfig(url="ftp://x", root="/r.json")
