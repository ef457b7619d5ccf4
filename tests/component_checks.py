"""Checks every component folder (components/<stage>/tests) runs on its own components: a
README generated from them, every input and output described, a metadata.yaml that
pipelines-components' validator would accept, and a body that makes one call into its task
module with arguments the task takes; plus the fakes its own task tests use."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from datetime import UTC
from pathlib import Path


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


def body_statements(component) -> list[ast.stmt]:
    """The body's statements after its docstring, imports left out."""
    function = ast.parse(textwrap.dedent(inspect.getsource(component.python_func))).body[0]
    body = function.body[1:] if ast.get_docstring(function) else function.body
    return [s for s in body if not isinstance(s, ast.Import | ast.ImportFrom)]


def undescribed(component) -> list[str]:
    """The inputs and outputs with no description in the docstring's ``Args:`` (or, for a
    returned output, ``Returns:``)."""
    import docstring_parser

    spec = component.component_spec
    args = {p.arg_name for p in docstring_parser.parse(component.python_func.__doc__).params}
    items = {**(spec.inputs or {}), **(spec.outputs or {})}
    return [name for name, item in items.items() if not item.description and name not in args]


# kubeflow/pipelines-components' rules for a metadata.yaml (scripts/validate_metadata):
# these fields in this order, the optional ones anywhere, a known stability, a Pipelines
# dependency, versions in semantic versioning (after an optional comparison), and a
# lastVerified timestamp less than a year old.
METADATA_REQUIRED = ["name", "stability", "dependencies", "lastVerified"]
METADATA_OPTIONAL = {"tags", "ci", "links"}
STABILITY = {"experimental", "alpha", "beta", "stable"}
SEMVER = re.compile(
    r"^(==|>=|<=)?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
)


def metadata_problems(path: Path) -> list[str]:
    """What pipelines-components' validator would refuse in a component's metadata.yaml."""
    from datetime import datetime

    import yaml

    data = yaml.safe_load(path.read_text())
    problems = []
    required = [key for key in data if key not in METADATA_OPTIONAL]
    if required != METADATA_REQUIRED:
        problems.append(f"fields {required}, expected {METADATA_REQUIRED} in this order")
    if data.get("stability") not in STABILITY:
        problems.append(f"stability {data.get('stability')!r}")
    dependencies = data.get("dependencies") or {}
    if set(dependencies) - {"kubeflow", "external_services"} or "kubeflow" not in dependencies:
        problems.append(f"dependencies {sorted(dependencies)}")
    kubeflow = dependencies.get("kubeflow") or []
    if not any(d.get("name") == "Pipelines" for d in kubeflow):
        problems.append("no Kubeflow Pipelines dependency")
    for d in kubeflow + (dependencies.get("external_services") or []):
        if not SEMVER.match(str(d.get("version", ""))):
            problems.append(f"version of {d.get('name')}: {d.get('version')!r}")
    verified = data.get("lastVerified")
    if not isinstance(verified, datetime):
        problems.append(f"lastVerified {verified!r} is not a timestamp")
    elif abs((datetime.now(UTC) - verified).days) >= 365:
        problems.append(f"lastVerified {verified:%Y-%m-%d} is a year old or more: verify again")
    if not isinstance(data.get("tags", []), list):
        problems.append("tags is not a list")
    return problems


def folder_tests(test_file: str, components: list):
    """The checks every component folder runs on its components, for its test module:
    ``test_readme, test_args, test_metadata, test_one_call, test_task_call =
    folder_tests(__file__, [component, ...])``."""
    import pytest
    from grail.components.readme import readme

    folder = Path(test_file).resolve().parents[1]
    stage = folder.name
    each = pytest.mark.parametrize("component", components, ids=lambda c: c.name)

    def test_its_readme_is_generated_from_the_component():
        """A README that drifted from the component: python -m grail.components.readme."""
        assert (folder / "README.md").read_text() == readme(stage)

    @each
    def test_its_docstring_describes_every_input_and_output(component):
        assert undescribed(component) == []

    def test_its_metadata_follows_pipelines_components_schema():
        assert metadata_problems(folder / "metadata.yaml") == []
        assert components and all(
            c.python_func.__module__.split(".")[2] == stage for c in components
        )

    @each
    def test_its_body_makes_one_call_into_its_task(component):
        (statement,) = body_statements(component)
        assert isinstance(statement, ast.Expr | ast.Return)
        assert isinstance(statement.value, ast.Call)
        assert len(task_calls(component)) == 1

    @each
    def test_its_body_calls_its_task_with_arguments_the_task_takes(component):
        modules = {module for module, _ in task_calls(component)}
        assert modules and all(m.startswith(f"grail.components.{stage}.") for m in modules)
        assert unbound_calls(component) == []

    return (
        test_its_readme_is_generated_from_the_component,
        test_its_docstring_describes_every_input_and_output,
        test_its_metadata_follows_pipelines_components_schema,
        test_its_body_makes_one_call_into_its_task,
        test_its_body_calls_its_task_with_arguments_the_task_takes,
    )


class FakeArtifact:
    """What a component's body hands its task of a KFP artifact: a path and metadata."""

    def __init__(self, path):
        self.path = str(path)
        self.metadata = {}


class FakeMetrics:
    """What a component's body hands its task of a KFP Metrics output."""

    def __init__(self):
        self.logged = {}

    def log_metric(self, name, value):
        self.logged[name] = value


def recorder(returns=None):
    """A stand-in for a task function: records each call's arguments, returns `returns`."""
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return returns

    record.calls = calls
    return record
