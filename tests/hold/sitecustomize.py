"""Loaded by the rehearsal's processes (PYTHONPATH=tests/hold) where a test needs to see
inside a pod: a pod about to die, so that the kill lands where the test says and not wherever
the machine's speed puts it.

With GRAIL_TEST_HOLD_AFTER_SAVE=N, every rank stops for good once transformers has run the
callbacks of step N's save (grail's upload callback has queued that checkpoint; its upload
thread goes on): the test waits for checkpoint-N to be complete in the store and kills the
process group, as a node failure would. Without it (a fast machine) the run could finish before
the kill, and the resume would start from a finished run instead of a killed one.

With GRAIL_TEST_LATE_RANK=S, every rank but the first waits S seconds before it writes its RNG
state into a checkpoint: the slow rank a busy node makes, which the first process must wait
for before it lists or uploads the checkpoint (grail.train.trainer.SavedOnEveryRank).
"""

import os

_HOLD = os.environ.get("GRAIL_TEST_HOLD_AFTER_SAVE")
_LATE = os.environ.get("GRAIL_TEST_LATE_RANK")

if _LATE:
    import time

    from transformers import Trainer

    _save_rng_state = Trainer._save_rng_state

    def _late_save_rng_state(self, output_dir):
        if self.args.process_index > 0:
            time.sleep(float(_LATE))
        return _save_rng_state(self, output_dir)

    Trainer._save_rng_state = _late_save_rng_state

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
