"""Settings the tests add to the tiny recipes: the recipes train the demo (32 prompts x 2
completions per step, what learning needs); a test of a mechanism needs 2 prompts per step."""

from pathlib import Path

TINY_GRPO = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "config_grpo.yaml"

SMOKE = ["--per_device_train_batch_size", "4"]


def tiny_args(data, model, out, *extra, recipe: Path = TINY_GRPO) -> list[str]:
    """``grail train`` arguments: a tiny recipe on `data` from `model` into `out`."""
    return [
        "--config",
        str(recipe),
        "--dataset",
        str(data),
        "--model_name_or_path",
        str(model),
        "--output_dir",
        str(out),
        *SMOKE,
        *map(str, extra),
    ]
