"""Settings the tests add to the tiny recipes: the recipes train the demo (epochs of behaviour
cloning, then 32 prompts x 2 completions per step, what learning needs); a test of a mechanism
needs 2 steps of cloning and 2 prompts per step."""

from pathlib import Path

TINY_GRPO = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "config_grpo.yaml"

# 2 prompts per step; the recipes' behaviour-cloning warm start kept (the path the demo takes),
# 2 steps of it
SMOKE = ["--per_device_train_batch_size", "4", "--sft_max_steps", "2"]
# GRAIL's discriminator pre-trained briefly (the recipe's 1,024 sampled prompts and 200 updates
# are the demo's): enough for a test of replicas, checkpoints and resumes; what pre-training
# gives is tests/test_gail.py's
GAIL_SMOKE = ["--gail_pretrain_prompts", "16", "--gail_pretrain_updates", "8"]


def classifier_args(classifier) -> list[str]:
    """The tiny GRAIL recipe with a tiny sequence classifier as its discriminator (the GPU
    recipes' kind: a transformer replica beside ZeRO-3), with the settings a classifier takes
    (the recipe's are its linear discriminator's)."""
    kind = ["--gail_discriminator", "classifier", "--gail_model", str(classifier)]
    return kind + ["--gail_lr", "1e-3", "--gail_max_grad_norm", "1", "--gail_max_length", "256"]


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
