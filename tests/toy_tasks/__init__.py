"""Tasks that are not grail's: a package of its own adds a task to grail's registry through
the ``grail.tasks`` entry point (docs/tasks.md). tests/test_parity_dag.py installs this one."""
