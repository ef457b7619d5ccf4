"""Loaded by the rehearsal's processes (PYTHONPATH=tests/hold) where a test needs to see
inside a pod: a pod about to die, so that the kill lands where the test says and not wherever
the machine's speed puts it.

With GRAIL_TEST_HOLD_AFTER_SAVE=N, every rank stops for good once transformers has run the
callbacks of step N's save (grail's upload callback has queued that checkpoint; its upload
thread goes on): the test waits for checkpoint-N to be complete in the store and kills the
process group, as a node failure would. Without it (a fast machine) the run could finish before
the kill, and the resume would start from a finished run instead of a killed one.
"""

import os

_HOLD = os.environ.get("GRAIL_TEST_HOLD_AFTER_SAVE")

if _HOLD:
    import time

    from transformers.trainer_callback import CallbackHandler

    _on_save = CallbackHandler.on_save

    def on_save(self, args, state, control):
        control = _on_save(self, args, state, control)
        if state.global_step == int(_HOLD):
            while True:  # until the test kills the pod
                time.sleep(60)
        return control

    CallbackHandler.on_save = on_save
