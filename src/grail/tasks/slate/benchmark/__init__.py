"""The slate task's benchmark (``grail benchmark``, ``grail compare``): :mod:`.run` scores its
systems (:mod:`.systems`: baselines, ceilings, models) as simulators of people
(:mod:`.scores`) and writes :mod:`.report` and :mod:`.records`; :mod:`.compare` pairs the
algorithms of one run; :mod:`.closing` is what ``grail run --local`` prints. See README.md."""
