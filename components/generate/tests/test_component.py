"""The generate component on its own: its README names its whole interface, and its body
calls its task module with arguments the task takes (what the pod runs, checked here)."""

from component_checks import folder_tests
from grail.components.generate.component import generate

test_readme, test_task_call = folder_tests(__file__, [generate])
