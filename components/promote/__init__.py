"""The promote component (the promotion gate): component.py (KFP), task.py (what the task does),
README.md, tests/."""
