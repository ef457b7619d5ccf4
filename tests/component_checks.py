"""Checks every component folder (components/<stage>/tests) runs on its own component: its
interface as KFP compiles it, its README, and the call from its body into its task module."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path


def interface(component) -> dict[str, dict[str, str]]:
    """The compiled component's inputs and outputs: name -> KFP type (parameter or artifact)."""
    spec = component.component_spec
    found = {}
    for side, items in (("inputs", spec.inputs or {}), ("outputs", spec.outputs or {})):
        found[side] = {name: str(item.type) for name, item in items.items()}
    return found


def undocumented(component, readme: Path) -> list[str]:
    """The inputs and outputs its README does not name (as `name`)."""
    text = readme.read_text()
    names = [n for side in interface(component).values() for n in side]
    return [n for n in names if f"`{n}`" not in text]


def task_calls(component) -> list[tuple[str, ast.Call]]:
    """(imported module, call) for each call in the component's body of a function the body
    imports from grail.components: what the pod will run."""
    body = ast.parse(textwrap.dedent(inspect.getsource(component.python_func)))
    imported = {
        alias.asname or alias.name: node.module
        for node in ast.walk(body)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grail.components")
        for alias in node.names
    }
    return [
        (imported[node.func.id], node)
        for node in ast.walk(body)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in imported
    ]


def unbound_calls(component) -> list[str]:
    """Calls from the body into a task module that would not bind to the task's signature (a
    parameter renamed or added on one side only), as ``function: why``."""
    wrong = []
    for module, call in task_calls(component):
        function = getattr(importlib.import_module(module), call.func.id)
        placeholders = [object()] * len(call.args)
        keywords = {k.arg: object() for k in call.keywords if k.arg}
        try:
            inspect.signature(function).bind(*placeholders, **keywords)
        except TypeError as error:
            wrong.append(f"{call.func.id}: {error}")
    return wrong


def folder_tests(test_file: str, components: list):
    """The two tests every component folder runs on its components, for its test module:
    ``test_readme, test_task_call = folder_tests(__file__, [component, ...])``."""
    import pytest

    folder = Path(test_file).resolve().parents[1]
    stage = folder.name
    each = pytest.mark.parametrize("component", components, ids=lambda c: c.name)

    @each
    def test_its_readme_names_every_input_and_output(component):
        assert undocumented(component, folder / "README.md") == []

    @each
    def test_its_body_calls_its_task_with_arguments_the_task_takes(component):
        modules = {module for module, _ in task_calls(component)}
        assert modules and all(m.startswith(f"grail.components.{stage}.") for m in modules)
        assert unbound_calls(component) == []

    return (
        test_its_readme_names_every_input_and_output,
        test_its_body_calls_its_task_with_arguments_the_task_takes,
    )
