"""Stage train: recipes, tiny GRPO and GRAIL runs on CPU, MLflow through transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_settings import GAIL_SMOKE, classifier_args
from tiny_settings import tiny_args as recipe_args

from grail.cli import main
from grail.core.errors import GrailError
from grail.train.config import GAIL_ENV, parse_train_args
from grail.train.stage import run

ROOT = Path(__file__).resolve().parents[1]
# training recipes (recipes/benchmark/ holds recipes of grail benchmark: tests/test_cli.py)
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if "benchmark" not in p.parts)
TINY_GRPO = ROOT / "recipes" / "tiny" / "config_grpo.yaml"
TINY_GRAIL = ROOT / "recipes" / "tiny" / "config_grail.yaml"


def tiny_args(recipe, data, model, out, *extra) -> list[str]:
    return recipe_args(data, model, out, *extra, recipe=recipe)


def test_the_shipped_recipes_are_the_ones_the_issue_names():
    names = {str(p.relative_to(ROOT / "recipes")) for p in RECIPES}
    assert {
        f"Qwen2.5-1.5B-Instruct/grpo/config_{m}_{i}.yaml"
        for m in ("grpo", "grail")
        for i in ("gun", "wage")
    } | {
        "tiny/config_grpo.yaml",
        "tiny/config_grail.yaml",
        "tiny/config_summarize.yaml",
        "Qwen2.5-3B-Instruct/summarize/config_grpo.yaml",
    } <= names


def test_a_quantized_base_is_refused_not_ignored(tmp_path):
    """TRL's ModelConfig has load_in_4bit, but grail's model loading does not quantize: a recipe
    asking for it would train a bf16 model while saying 4-bit."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_GRPO.read_text() + "load_in_4bit: true\n")
    with pytest.raises(GrailError, match="load_in_4bit: grail does not quantize"):
        parse_train_args(["--config", str(recipe)])
    from grail.core.recipes import read_recipe
    from grail.train.config import check_recipe

    with pytest.raises(GrailError, match="r.yaml: load_in_4bit"):
        check_recipe(read_recipe(recipe), str(recipe))


def test_a_hub_token_is_refused_and_never_saved(tmp_path, capsys):
    """TrainingArguments has hub_token, and the trainer pickles its arguments into
    training_args.bin in output_dir and every checkpoint: a token on the command line or in a
    recipe is refused in one line that does not repeat it, before output_dir exists."""
    secret = "hf_notarealtokenbutasecret"
    out = tmp_path / "out"
    status = main(["train", "--config", str(TINY_GRPO), "--output_dir", str(out),
                   "--hub_token", secret])  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "hub_token: a secret is never a training argument" in line
    assert secret not in line and not out.exists()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_GRPO.read_text() + f"hub_token: {secret}\n")
    from grail.core.recipes import read_recipe
    from grail.train.config import check_recipe

    with pytest.raises(GrailError, match="r.yaml: hub_token: a secret") as refused:
        check_recipe(read_recipe(recipe), str(recipe))
    assert secret not in str(refused.value)


def test_an_empty_recipe_on_a_machine_without_bf16_names_the_fix(tmp_path, capsys):
    """TRL's GRPOConfig trains in bf16 unless told otherwise: on a CPU an empty recipe failed
    with transformers' words about ``use_cpu``; the line names the recipe, bf16 and the fix."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine's GPU may have bf16: the refusal is a CPU machine's")
    recipe = tmp_path / "empty.yaml"
    recipe.write_text("")
    assert main(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "o")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{recipe}: bf16: true" in line and "set bf16: false" in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_every_shipped_recipe_parses(recipe, monkeypatch):
    import transformers.training_args

    # GPU recipes ask for bf16; pretend an Ampere+ GPU so TrainingArguments accepts it on CPU.
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    header = recipe.read_text().split("\n\n")[0]
    assert header.startswith("# ") and "Needs:" in header and "Run:" in header
    config, model_config = parse_train_args(["--config", str(recipe)])
    assert model_config.model_name_or_path and config.dataset
    if not config.rl:  # behaviour cloning alone: no reward is ever computed
        assert config.sft_dataset == "choices" and "bc" in recipe.name
        return
    assert config.reward_funcs and len(config.reward_weights) == len(config.reward_funcs)
    if "grail" in recipe.name:  # a classifier to read, or the linear discriminator
        assert config.gail_use and bool(config.gail_model) == (
            config.gail_discriminator == "classifier"
        )


def test_without_reward_funcs_a_recipe_trains_the_tasks_proper_reward(tmp_path):
    """No reward_funcs: the slate task's log score (proper: optimal at people's distribution)
    and its format, never the mode-seeking accuracy; the summarize task's own."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: m\ndataset: d\nuse_cpu: true\nreport_to: none\n")
    config, _ = parse_train_args(["--config", str(recipe), "--output_dir", str(tmp_path / "o")])
    assert config.reward_funcs == ["log_score", "format"]
    config, _ = parse_train_args(
        ["--config", str(recipe), "--output_dir", str(tmp_path / "o"), "--task", "summarize"]
    )
    assert config.reward_funcs == ["answered", "summary_format"]


def test_unknown_recipe_key_and_option_are_named(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_GRPO.read_text() + "lerning_rate: 0.1\n")
    with pytest.raises(GrailError, match="unknown recipe key 'lerning_rate'"):
        parse_train_args(["--config", str(recipe)])
    assert main(["train", "--config", str(recipe)]) == 2
    assert "lerning_rate" in capsys.readouterr().err
    with pytest.raises(GrailError, match="--no_such_flag"):
        parse_train_args(["--config", str(TINY_GRPO), "--no_such_flag", "1"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("beta: -1", "beta must be >= 0, got -1"),
        ("learning_rate: -0.1", "learning_rate must be > 0"),
        ("temperature: 0", "temperature must be > 0"),
        ("top_p: 1.5", "top_p must be within (0, 1]"),
        ("gail_lr: 0", "gail_lr must be > 0"),
        ("gail_replay_size: 0", "gail_replay_size must be >= 1"),
        ("reward_funcs: [accuracy, nope]", "reward_funcs: unknown reward 'nope'"),
        ("beta: 0.0\nbeta: 0.04", "line 2, column 1: key 'beta' is given twice"),
        ("beta: [1, 2\nlr: 3", "not valid YAML (line 2, column 3: expected ','"),
        ("checkpoint_uri: s3://b/a/../x", "checkpoint_uri: s3://b/a/../x: a '..' segment"),
        ("sft_thoughts: teacher", "sft_teacher: set it (a grail generate output) with"),
        ("sft_teacher: gen/", "sft_teacher: set it (a grail generate output) with"),
        ("sft_dataset: null\nsft_thoughts: own", "sft_thoughts: own is behaviour cloning's"),
        ("rl_signal_guard: halt", "rl_signal_guard"),
        ("rl_signal_patience: 0", "rl_signal_patience must be >= 1"),
    ],
)
def test_a_value_out_of_range_is_one_line_naming_the_recipe_before_any_model_loads(
    line, message, tmp_path, capsys
):
    """The probe's cases (beta -1 trained with the KL reversed; a negative learning rate or
    temperature crashed after loading the model): one line naming the recipe and the key, exit
    2. The model path does not exist, so nothing got as far as loading it."""
    recipe = tmp_path / "r.yaml"
    keys = {part.split(":")[0] for part in line.splitlines()}
    rest = [r for r in TINY_GRPO.read_text().splitlines() if r.split(":")[0] not in keys]
    recipe.write_text("\n".join([line, *rest]) + "\n")
    argv = ["train", "--config", str(recipe), "--model_name_or_path", str(tmp_path / "none")]
    argv += ["--dataset", str(tmp_path / "none"), "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"grail: error: {recipe}: ") and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_value_out_of_range_names_where_it_came_from(tmp_path, capsys, monkeypatch):
    argv = ["train", "--config", str(TINY_GRPO), "--output_dir", str(tmp_path / "out")]
    assert main([*argv, "--beta", "-0.5"]) == 2
    assert "grail: error: command line: beta must be >= 0" in capsys.readouterr().err
    monkeypatch.setenv("GAIL_LR", "-1")
    assert main(argv) == 2
    assert "grail: error: $GAIL_LR: gail_lr must be > 0, got -1" in capsys.readouterr().err


def test_overrides_and_help(capsys):
    config, model_config = parse_train_args(
        ["--config", str(TINY_GRPO), "--max_steps", "7", "--model_name_or_path", "elsewhere"]
    )
    assert config.max_steps == 7 and model_config.model_name_or_path == "elsewhere"
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for name in ("--checkpoint_uri", "--gail_replay_size", "--history_depth", "--reward_funcs"):
        assert name in out
    assert "Replay buffer capacity" in out


GAIL_VALUES = {
    "gail_use": ("true", True),
    "gail_weight": ("0.125", 0.125),
    "gail_alpha": ("2.5", 2.5),
    "gail_lr": ("0.003", 0.003),
    "gail_weight_decay": ("0.5", 0.5),
    "gail_discriminator": ("classifier", "classifier"),
    "gail_model": ("some/classifier", "some/classifier"),
    "gail_device": ("cpu", "cpu"),
    "gail_replay_size": ("77", 77),
    "gail_minibatch": ("6", 6),
    "gail_updates_per_step": ("3", 3),
    "gail_eval_mode": ("off", "off"),
    "gail_learnable_weight": ("true", True),
    "gail_max_length": ("99", 99),
    "gail_max_grad_norm": ("0.25", 0.25),
    "gail_context": ("choice", "choice"),
    "gail_pretrain_prompts": ("17", 17),
    "gail_pretrain_updates": ("5", 5),
}


def test_every_gail_field_has_an_env_variable():
    assert set(GAIL_ENV) == set(GAIL_VALUES)


@pytest.mark.parametrize("field", sorted(GAIL_VALUES))
def test_gail_env_variable_overrides_the_recipe_and_the_command_line_wins(field, monkeypatch):
    raw, expected = GAIL_VALUES[field]
    # the recipe's linear discriminator replaced by a classifier, which gail_use needs a model for
    monkeypatch.setenv("GAIL_DISCRIMINATOR", "classifier")
    monkeypatch.setenv("GAIL_MODEL", "some/classifier")
    monkeypatch.setenv(GAIL_ENV[field], raw)
    config, _ = parse_train_args(["--config", str(TINY_GRAIL)])
    assert getattr(config, field) == expected
    if field == "gail_minibatch":
        config, _ = parse_train_args(["--config", str(TINY_GRAIL), "--gail_minibatch", "9"])
        assert config.gail_minibatch == 9


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_tiny_grpo_three_steps_logs_a_loss_and_changes_parameters(
    tmp_path, tiny_policy, small_clean
):
    # 2 prompts x 4 completions per step: with one prompt, a group whose four answers earn the
    # same reward has no advantage, and at the start (policy = reference) no KL gradient either
    args = tiny_args(TINY_GRPO, small_clean, tiny_policy, tmp_path / "out", "--max_steps", 3)
    summary = run(*parse_train_args([*args, "--per_device_train_batch_size", "8"]))
    assert summary["global_step"] == 3
    rows = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert {
            "loss",
            "reward",
            "kl",
            "step_time",
            "num_tokens",
            "rewards/log_score/mean",
        } <= set(row)
    before, after = _weights(tiny_policy), _weights(tmp_path / "out")
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert changed, "no trainable parameter changed"


def _fused_log_probs(model, ids, labels, scored: list[int]):
    """TRL's fused head on `model`: completion log-probs, entropies and the head's gradient;
    `scored` gets the number of positions each chunked log-prob call was given."""
    from trl.trainer import utils

    original = utils._ChunkedLogProbFunction.apply

    def counted(hidden, *rest):
        scored.append(hidden.shape[0])
        return original(hidden, *rest)

    model.zero_grad()
    utils._ChunkedLogProbFunction.apply = counted
    try:
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    finally:
        utils._ChunkedLogProbFunction.apply = original
    out.log_probs.sum().backward()
    mask = labels[:, 1:] != -100
    return out.log_probs[mask], out.entropy[mask], model.lm_head.weight.grad.clone()


def test_trls_fused_head_scores_only_completions_on_cpu_with_the_same_log_probs(monkeypatch):
    """grail.train.overrides.score_completions_only_on_cpu: TRL 1.16 scores every position on CPU;
    patched, only the completion's, with the same log-probabilities and gradient."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.trainer import utils

    from grail.train.overrides import score_completions_only_on_cpu

    # TRL's own choice (a trainer built earlier in this process has patched it); what was
    # there is put back after the test
    own = getattr(utils._use_triton, "__wrapped__", utils._use_triton)
    monkeypatch.setattr(utils, "_use_triton", own)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(config)
    utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    ids = torch.randint(config.vocab_size, (3, 40))
    labels = ids.clone()
    labels[:, :-6] = -100  # a 34-token prompt, a 6-token completion
    full_scored, compact_scored = [], []
    full = _fused_log_probs(model, ids, labels, full_scored)
    score_completions_only_on_cpu()
    score_completions_only_on_cpu()  # idempotent: wraps TRL's function once
    assert not hasattr(utils._use_triton.__wrapped__, "grail_cpu")
    compact = _fused_log_probs(model, ids, labels, compact_scored)
    assert sum(full_scored) == 3 * 39 and sum(compact_scored) == 3 * 6
    for before, after in zip(full, compact, strict=True):
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)


def test_tiny_grail_logs_the_discriminator(tmp_path, tiny_policy, tiny_discriminator, small_clean):
    summary = run(
        *parse_train_args(
            tiny_args(
                TINY_GRAIL,
                small_clean,
                tiny_policy,
                tmp_path / "out",
                "--max_steps",
                4,
                *classifier_args(tiny_discriminator),
                "--gail_learnable_weight",  # the fixed weight (the recipe learns it from 0)
                "false",
                *GAIL_SMOKE,
            )
        )
    )
    assert summary["reward_funcs"][-1] == "discriminator"
    assert summary["reward_weights"][-1] == pytest.approx(0.3)
    assert sum(summary["reward_weights"]) == pytest.approx(1.0)
    rows = json.loads((tmp_path / "out" / "metrics.json").read_text())
    logged = [r for r in rows if "gail/disc_loss" in r]
    assert logged and all(r["gail/disc_loss"] > 0 for r in logged)
    assert all("rewards/discriminator/mean" in r for r in rows)


def test_mlflow_gets_params_and_metrics_into_the_given_run(
    tmp_path, tiny_policy, small_clean, monkeypatch
):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment(
        "grail-test", artifact_location=str(tmp_path / "artifacts")
    )
    parent = client.create_run(experiment).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", parent)
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "false")
    assert (
        main(
            [
                "train",
                *tiny_args(TINY_GRPO, small_clean, tiny_policy, tmp_path / "out", "--max_steps", 2),
            ]
        )
        == 0
    )
    run_data = client.get_run(parent).data
    assert "learning_rate" in run_data.params and "gail_use" in run_data.params
    history = client.get_metric_history(parent, "reward")
    assert [m.step for m in history] == [1, 2]


def test_train_help_shows_grails_fields_first_and_points_to_trls(capsys):
    from grail.cli import main

    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.index("--gail_context") < out.index("--help-all")
    assert "--learning_rate" not in out and len(out.splitlines()) < 150


def test_a_non_finite_loss_stops_training_with_one_line_and_no_model(
    tmp_path, tiny_policy, small_clean, capsys
):
    """A learning rate of 1e30 is finite and in range, but Adam moves every weight by about
    that much: the second step's loss is not finite. Before, training went on and the NaN
    model was saved (and exported with exit 0)."""
    out = tmp_path / "out"
    args = tiny_args(TINY_GRPO.parent / "config_bc.yaml", small_clean, tiny_policy, out)
    args += ["--sft_learning_rate", "1e30", "--sft_warmup_ratio", "0"]
    assert (
        main(
            [
                "train",
                *args,
                "--sft_holdout_fraction",
                "0",
                "--sft_max_steps",
                "3",
                "--sft_max_train_rows",
                "16",
                "--max_train_rows",
                "8",
            ]
        )
        == 1
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is nan: training stopped and no model saved" in last or "is inf" in last, last
    assert not (out / "sft" / "config.json").exists()
    assert not (out / "summary.json").exists()
