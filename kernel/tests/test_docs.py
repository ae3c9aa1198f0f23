"""The plugin-author docs stay true: their examples parse, validate and match the code they show."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

from skulk_kernel import hookspecs
from skulk_kernel.profiles import bundled_profile_names, parse_profile

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ECHO = ROOT / "plugins" / "engine-echo"
SPEC_MODULES = [hookspecs] + [
    importlib.import_module(f"{path.parent.name}.hookspecs") for path in ROOT.glob("plugins/*/src/*/hookspecs.py")
]  # the kernel's hooks and those plugins declare (docs/hooks.md, "Plugin <name>")
HOOKS = {name for module in SPEC_MODULES for name, fn in vars(module).items() if hasattr(fn, "skulk_spec")}


def blocks(doc: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (DOCS / doc).read_text(), flags=re.S)


def hookimpl_names(tree: ast.AST) -> list[str]:
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(ast.unparse(d) == "hookimpl" for d in node.decorator_list)
    ]


@pytest.mark.parametrize("doc", ["hooks.md", "writing-plugins.md", "profiles.md"])
def test_python_examples_parse_and_implement_real_hooks(doc: str) -> None:
    for block in blocks(doc, "python"):
        tree = ast.parse(block)
        unknown = set(hookimpl_names(tree)) - HOOKS
        assert not unknown, f"{doc}: example implements hooks that do not exist: {unknown}"


@pytest.mark.parametrize("doc", ["writing-plugins.md", "profiles.md"])
def test_profile_examples_validate(doc: str) -> None:
    profiles = [b for b in blocks(doc, "toml") if "[profile]" in b]
    assert profiles
    for block in profiles:
        profile = parse_profile(block, f"{doc} example")
        assert profile.plugins
        assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", p) for p in profile.plugins)


def test_profiles_doc_lists_exactly_the_bundled_profiles() -> None:
    text = (DOCS / "profiles.md").read_text()
    section = text.split("## Bundled profiles", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z0-9-]+)`", section, flags=re.M)
    assert sorted(listed) == bundled_profile_names()


def test_writing_plugins_pyproject_is_engine_echos() -> None:
    shown = next(b for b in blocks("writing-plugins.md", "toml") if "[project]" in b)
    assert tomllib.loads(shown) == tomllib.loads((ECHO / "pyproject.toml").read_text())


def test_writing_plugins_plugin_py_matches_engine_echo() -> None:
    shown = next(b for b in blocks("writing-plugins.md", "python") if "class EchoConfig" in b)
    real = ast.parse((ECHO / "src" / "skulk_engine_echo" / "plugin.py").read_text())
    doc = ast.parse(shown)
    assert hookimpl_names(doc) == hookimpl_names(real)

    def config_fields(tree: ast.AST) -> str:
        cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "EchoConfig")
        fields = [s for s in cls.body if isinstance(s, ast.AnnAssign)]
        return ast.dump(ast.Module(body=fields, type_ignores=[]))

    assert config_fields(doc) == config_fields(real)


def test_writing_plugins_conformance_example_is_the_real_test() -> None:
    shown = next(b for b in blocks("writing-plugins.md", "python") if "class TestEchoEngine" in b)
    real = (ECHO / "tests" / "test_echo_conformance.py").read_text()

    def classes(source: str) -> list[str]:
        return [ast.dump(n) for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]

    assert classes(shown) == classes(real)


@pytest.mark.parametrize("doc", ["hooks.md", "writing-plugins.md", "profiles.md"])
def test_relative_links_resolve(doc: str) -> None:
    for target in re.findall(r"\]\(([^)#:]+)\)", (DOCS / doc).read_text()):
        assert (DOCS / target).exists(), f"{doc} links to missing {target}"


def test_thirdparty_example_exists() -> None:
    assert (ROOT / "tests" / "thirdparty" / "skulk-hello" / "pyproject.toml").is_file()
