"""The counterfactual component: component.py (KFP), task.py (what the task does), README.md,
tests/."""
