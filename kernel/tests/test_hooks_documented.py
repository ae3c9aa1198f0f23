"""docs/hooks.md documents every hookspec with its exact signature, in banner order; every
hookspec docstring says when it is called, on which nodes and how results combine (rule 2.4).

Hooks a plugin declares live in ``plugins/<name>/src/<package>/hookspecs.py`` (added by the
plugin's `add_hookspecs`); they are documented after the kernel's, under ``# Plugin <name>``, and
each is checked to really be added by its plugin and callable whatever the load order.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from skulk_kernel import hookimpl, hookspecs
from skulk_kernel.plugins import build_plugin_manager, check_unknown_hooks, new_plugin_manager, register_plugin
from skulk_kernel.profiles import Profile

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "hooks.md"
COMBINES = ("results are ignored", "collected", "first non-none", "first result")
WHERE = ("every node", "nodes that", "the master", "the api", "runner", "cli")


def spec_names(module: ModuleType = hookspecs) -> list[str]:
    found = [
        (fn.__code__.co_firstlineno, name)
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and hasattr(fn, "skulk_spec")
    ]
    return [name for _, name in sorted(found)]


def plugin_spec_modules() -> dict[str, ModuleType]:
    """{plugin name: its hookspecs module}, for every in-tree plugin that declares hooks."""
    return {
        path.parents[2].name: importlib.import_module(f"{path.parent.name}.hookspecs")
        for path in sorted(ROOT.glob("plugins/*/src/*/hookspecs.py"))
    }


def owners() -> dict[str, ModuleType]:
    """{hook name: the module declaring it}: the kernel's hooks, then every plugin's."""
    found = {name: hookspecs for name in spec_names()}
    for module in plugin_spec_modules().values():
        for name in spec_names(module):
            assert name not in found, f"hook {name} is declared twice: {found[name].__name__}, {module.__name__}"
            found[name] = module
    return found


PLUGIN_HOOKS = [(plugin, name) for plugin, module in plugin_spec_modules().items() for name in spec_names(module)]


def banners() -> list[tuple[str, list[str]]]:
    """[(banner title, [hook names under it])] from hookspecs.py, in source order."""
    groups: list[tuple[str, list[str]]] = []
    for line in inspect.getsource(hookspecs).splitlines():
        if m := re.match(r"# =+ (.+?) =+$", line):
            groups.append((m.group(1), []))
        elif (m := re.match(r"def (\w+)\(", line)) and m.group(1) in spec_names():
            groups[-1][1].append(m.group(1))
    return groups


def doc_structure() -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """([(group heading, [hook headings])], {hook: the section's text}) from docs/hooks.md."""
    groups: list[tuple[str, list[str]]] = []
    sections: dict[str, str] = {}
    current: str | None = None
    in_code = False
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or line.startswith("```"):
            if current:
                sections[current] += line + "\n"
            continue
        if line.startswith("# "):
            groups.append((line[2:].strip(), []))
            current = None
        elif line.startswith("## "):
            current = line[3:].strip()
            groups[-1][1].append(current)
            sections[current] = ""
        elif current:
            sections[current] += line + "\n"
    return groups[1:], sections  # the first H1 is the page title


def norm(annotation: str | None) -> str | None:
    return None if annotation is None else ast.unparse(ast.parse(annotation, mode="eval"))


def documented_signature(section: str, name: str) -> tuple[ast.FunctionDef, str]:
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    for block in blocks:
        tree = ast.parse(block)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                decorators = [ast.unparse(d) for d in node.decorator_list]
                return node, decorators[0] if decorators else ""
    raise AssertionError(f"docs/hooks.md section {name!r} has no ```python block with def {name}(...)")


def test_docs_exist() -> None:
    assert DOC.is_file()


@pytest.mark.parametrize("name", list(owners()))
def test_every_hookspec_is_documented_with_its_signature(name: str) -> None:
    _, sections = doc_structure()
    assert name in sections, f"docs/hooks.md has no '## {name}' heading"
    documented, decorator = documented_signature(sections[name], name)
    spec = getattr(owners()[name], name)
    params = inspect.signature(spec).parameters
    doc_args = [(a.arg, norm(ast.unparse(a.annotation)) if a.annotation else None) for a in documented.args.args]
    spec_args = [
        (p.name, norm(p.annotation) if p.annotation is not inspect.Parameter.empty else None) for p in params.values()
    ]
    assert doc_args == spec_args, f"{name}: docs say {doc_args}, hookspecs.py says {spec_args}"
    ret = spec.__annotations__.get("return")
    assert norm(ast.unparse(documented.returns) if documented.returns else None) == norm(ret), name
    opts: dict[str, Any] = spec.skulk_spec
    expected = "hookspec" + (
        "(historic=True)" if opts.get("historic") else "(firstresult=True)" if opts.get("firstresult") else ""
    )
    assert decorator == expected, f"{name}: documented as @{decorator}, spec is @{expected}"


@pytest.mark.parametrize("name", list(owners()))
def test_every_section_says_when_where_and_results(name: str) -> None:
    _, sections = doc_structure()
    text = sections[name]
    for label in ("**When:**", "**Where:**", "**Results:**"):
        assert label in text, f"docs/hooks.md section {name!r} lacks {label}"


def test_documented_hooks_all_exist() -> None:
    _, sections = doc_structure()
    extra = sorted(set(sections) - set(owners()))
    assert not extra, f"docs/hooks.md documents hooks that no hookspecs.py defines: {extra}"


def test_docs_follow_the_banner_groups_and_order() -> None:
    """The kernel's banner groups in order, then one `# Plugin <name>` group per plugin."""
    groups, _ = doc_structure()
    documented = [(title.lower(), hooks) for title, hooks in groups]
    expected = [(title.lower(), hooks) for title, hooks in banners()]
    expected += [(f"plugin {plugin}", spec_names(module)) for plugin, module in plugin_spec_modules().items()]
    assert documented == expected


def test_the_http_hooks_belong_to_api_control() -> None:
    assert owners()["register_api_routes"].__name__ == "skulk_api_control.hookspecs"
    assert not hasattr(hookspecs, "register_api_routes")


@pytest.mark.parametrize(("plugin", "name"), PLUGIN_HOOKS)
def test_every_plugin_hook_is_added_by_its_plugin_and_works_in_any_load_order(plugin: str, name: str) -> None:
    module = plugin_spec_modules()[plugin]
    pm = build_plugin_manager(Profile(name="owner-only", plugins=(plugin,)))
    assert getattr(pm.hook, name).spec.namespace is module, f"{plugin}'s add_hookspecs does not add {name}"
    argnames = list(inspect.signature(getattr(module, name)).parameters)
    for consumer_first in (True, False):
        seen: list[dict[str, Any]] = []
        namespace: dict[str, Any] = {"seen": seen}
        exec(f"def {name}({', '.join(argnames)}):\n    seen.append(dict(locals()))\n", namespace)
        consumer = type("Consumer", (), {name: staticmethod(hookimpl(namespace[name]))})()
        owner = importlib.import_module(pm.get_plugin(plugin).__name__)
        pm = new_plugin_manager()
        order = [(consumer, "consumer"), (owner, plugin)]
        for obj, label in order if consumer_first else order[::-1]:
            register_plugin(pm, obj, label)
        check_unknown_hooks(pm)
        kwargs = {arg: f"<{arg}>" for arg in argnames}
        pm.subset_hook_caller(name, remove_plugins=[owner])(**kwargs)  # the owner's own impl wants real args
        assert seen == [kwargs], f"{name}: a plugin loaded {'before' if consumer_first else 'after'} {plugin}"


@pytest.mark.parametrize("name", list(owners()))
def test_every_hookspec_docstring_says_when_where_and_how_results_combine(name: str) -> None:
    doc = inspect.getdoc(getattr(owners()[name], name)) or ""
    assert doc.strip(), f"hookspec {name} has no docstring"
    lowered = " ".join(doc.lower().split())
    assert "called" in lowered, f"hookspec {name}: the docstring must say when it is called"
    assert any(w in lowered for w in WHERE), f"hookspec {name}: the docstring must say on which nodes"
    assert any(c in lowered for c in COMBINES), (
        f"hookspec {name}: the docstring must say how results combine ({' / '.join(COMBINES)})"
    )


def test_decision_hooks_are_firstresult_and_have_kernel_defaults() -> None:
    from skulk_kernel import defaults

    firstresult = [n for n in spec_names() if getattr(hookspecs, n).skulk_spec.get("firstresult")]
    assert firstresult == [n for _, hooks in banners() if _.startswith("decisions") for n in hooks]
    for name in firstresult:
        assert hasattr(defaults, name), f"decision hook {name} has no kernel default"
