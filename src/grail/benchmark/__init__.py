"""Stage benchmark (and compare): baselines, models at every checkpoint, simulator metrics,
reports."""
