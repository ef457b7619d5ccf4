"""The KFP components, one folder per stage (component.py, task.py, README.md, tests/):
typed parameters and artifacts in, one call into the stage, artifacts and metrics out."""
