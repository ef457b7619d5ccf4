"""Settings the tests add to the tiny recipes: the recipes train the demo (8 prompts x 4
completions per step, what learning needs); a test of a mechanism needs 1 prompt per step."""

SMOKE = ["--per_device_train_batch_size", "4"]
