"""What is particular to each task grail trains simulators for; everything else is shared.

- ``slate``: which video a person clicks next from a recommendation slate (the GRAIL study). Its
  parts predate this package and live in the stages (``study/``, ``clean/``, ``core/prompts``,
  ``core/rewards``, ``benchmark/baselines``).
- ``summarize``: document summaries scored by how many hidden questions a reader answers from
  them (OpenPipe's Summary-RL on RepLiQA): :mod:`grail.tasks.summarize`.

docs/tasks.md says what a new task touches.
"""

from typing import Literal

Task = Literal["slate", "summarize"]
TASKS = ("slate", "summarize")
