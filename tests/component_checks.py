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
