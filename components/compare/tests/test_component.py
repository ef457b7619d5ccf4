"""The compare component on its own: its README names its whole interface, and its body
calls its task module with arguments the task takes (what the pod runs, checked here)."""

from pathlib import Path

import pytest
from component_checks import task_calls, unbound_calls, undocumented
from grail.components.compare.component import compare

README = Path(__file__).parents[1] / "README.md"
COMPONENTS = [compare]


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_its_readme_names_every_input_and_output(component):
    assert undocumented(component, README) == []


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_its_body_calls_its_task_with_arguments_the_task_takes(component):
    modules = {module for module, _ in task_calls(component)}
    assert modules and all(
        m.startswith("grail.components.compare.")
        for m in modules - {"grail.components.train.trainjob"}
    )
    assert unbound_calls(component) == []
