"""Stage benchmark (and compare): each task's benchmark run from its settings, through the
task registry."""
