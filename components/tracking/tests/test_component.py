"""The tracking component on its own: its README names its whole interface, and its body
calls its task module with arguments the task takes (what the pod runs, checked here)."""

from component_checks import folder_tests
from grail.components.tracking.component import finish_tracking, start_tracking

test_readme, test_task_call = folder_tests(__file__, [start_tracking, finish_tracking])
