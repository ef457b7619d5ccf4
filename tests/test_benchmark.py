"""Stage benchmark: pinned baselines and intervals, the synthetic ceiling, local vs served models,
checkpoints per step, charts and report."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from ports import free_port
from tiny_settings import SMOKE

from grail.benchmark.stage import run
from grail.cli import main
from grail.core.bootstrap import participant_bootstrap
from grail.core.outputs import mark_complete
from grail.tasks.slate.baselines import BASELINES, Skipped, knn_tfidf, ranker
from grail.tasks.slate.contract import SCHEMA, read_dataset
from grail.tasks.slate.prompts import PromptOptions
from grail.train.config import parse_train_args
from grail.train.stage import run as train

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"


def _item(vid, views=100):
    return {
        "id": vid,
        "title": f"Video {vid}",
        "channel": f"Channel {vid[0]}",
        "duration_seconds": 60,
        "views": views,
        "likes": 1,
        "comments": 1,
    }


def _row(k, party, slate, gold_id, split="validation", **extra):
    return {
        "participant_id": f"p{k}",
        "session_id": f"s{k}",
        "study": "study1",
        "issue": "gun_control",
        "step_index": 0,
        "current_video": {"id": "c", "title": "Current", "channel": "C"},
        "history": [],
        "slate": slate,
        "gold_index": [i["id"] for i in slate].index(gold_id) + 1,
        "gold_id": gold_id,
        "n_options": len(slate),
        "viewer": {"pid1": party, "ideo1": "Liberal" if party == "Democrat" else "Conservative"},
        "opinion_before": 0.5,
        "opinion_after": 0.5,
        "opinion_direction": "no_change",
        "split": split,
    } | extra


def hand_made():
    """Democrats click the d-video, Republicans the r-video, wherever it is displayed."""
    train = [
        _row(
            k,
            party,
            [_item("d1", 10), _item("r1", 50), _item("x1", 5)][:: 1 - 2 * (k % 2)],
            "d1" if party == "Democrat" else "r1",
            split="train",
        )
        for k, party in enumerate(["Democrat", "Republican"] * 20)
    ]
    rows = [
        _row(100, "Democrat", [_item("d1", 10), _item("r1", 50), _item("x1", 5)], "d1"),
        _row(101, "Republican", [_item("x1", 500), _item("d1", 10), _item("r1", 50)], "r1"),
        _row(102, "Democrat", [_item("r1", 50), _item("d1", 10)], "d1"),
        _row(
            103,
            "Republican",
            [_item("r1", 50), _item("x1", 9), _item("d1", 10), _item("y1", 1)],
            "r1",
        ),
    ]
    return train, rows


def test_every_baseline_is_pinned_on_a_hand_made_set():
    train, rows = hand_made()
    # Train golds are position 1 (Democrats, d1 first) and 2 (Republicans, reversed slates)
    # 20 times each; the tie goes to the position seen first, 1.
    expected = {
        "always_first": [1, 1, 1, 1],
        "always_last": [3, 3, 2, 4],
        "most_frequent_position": [1, 1, 1, 1],
        "most_viewed": [2, 1, 1, 1],
        "knn_tfidf": [1, 3, 2, 1],
        "ranker": [1, 3, 2, 1],
    }
    for name, baseline in BASELINES.items():
        guesses = baseline(train, rows)
        assert guesses.predictions == expected[name], name
        for shares, row in zip(guesses.distributions, rows, strict=True):  # one per option
            assert len(shares) == row["n_options"] and abs(sum(shares) - 1) < 1e-9, name
    # Position rules share the train split's frequencies per slate size (add-one smoothed):
    # 3-option slates, 20 golds at 1 and 20 at 2 -> (21, 21, 1) / 43.
    assert BASELINES["always_first"](train, rows).distributions[0] == pytest.approx(
        [21 / 43, 21 / 43, 1 / 43]
    )
    for needs_train in ("most_frequent_position", "knn_tfidf", "ranker"):
        with pytest.raises(Skipped, match="needs a train split"):
            BASELINES[needs_train]([], rows)


def test_benchmark_metrics_and_participant_intervals_on_the_hand_made_set(tmp_path):
    train, rows = hand_made()
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.Table.from_pylist(train, schema=SCHEMA), data / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), data / "validation.parquet")
    mark_complete(data, "a hand-made dataset")
    result = run(data, tmp_path / "out")
    systems = result["systems"]
    assert systems["always_first"]["correct"] == 2 and systems["always_first"]["n"] == 4
    # Intervals resample participants (here one row each), not Wilson's independent rows.
    hits = np.array([1.0, 0.0, 1.0, 0.0])  # always_first on the four rows
    people = [r["participant_id"] for r in rows]
    low, high = participant_bootstrap(lambda k: hits[k].mean(), people, 1000)
    assert (systems["always_first"]["ci_low"], systems["always_first"]["ci_high"]) == (
        round(low, 4),
        round(high, 4),
    )
    assert systems["ranker"]["accuracy"] == 1.0
    assert (systems["ranker"]["ci_low"], systems["ranker"]["ci_high"]) == (1.0, 1.0)
    assert systems["random (expected)"]["accuracy"] == round((1 / 3 + 1 / 3 + 1 / 2 + 1 / 4) / 4, 4)
    # random's choice distribution is uniform: its log-loss is the mean log slate size
    assert systems["random (expected)"]["log_loss"] == pytest.approx(
        np.mean(np.log([3, 3, 2, 4])), abs=1e-4
    )
    for name in ("always_first", "ranker", "knn_tfidf", "most_viewed"):
        entry = systems[name]
        for key in ("log_loss", "brier", "ece", "position_tv"):
            low, high = entry[f"{key}_ci"]
            assert low <= entry[key] + 1e-9 or key == "ece", (name, key)
    assert systems["ranker"]["log_loss"] < systems["always_first"]["log_loss"]
    assert systems["most_viewed"]["positions"] == {"1": 3, "2": 1}
    assert "collapsed" not in systems["always_first"]  # a baseline's rule is not a collapse
    assert result["win_rates"]["ranker"]["always_first"] == 0.75
    assert result["win_rates"]["always_first"]["ranker"] == 0.25
    assert "bayes_optimal (expected)" not in systems  # not a simulated study
    assert "over participants" in result["intervals"]


def test_without_a_train_split_the_train_baselines_say_why(tmp_path):
    _, rows = hand_made()
    path = tmp_path / "only.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
    result = run(path, tmp_path / "out")
    assert set(result["skipped"]) == {"most_frequent_position", "knn_tfidf", "ranker"}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Skipped" in report and "knn_tfidf: needs a train split" in report


@pytest.mark.integration  # every baseline on the whole default study: 27 s
def test_on_the_default_study_knn_and_ranker_beat_random_and_nothing_beats_the_ceiling(
    default_clean, tmp_path
):
    result = run(default_clean, tmp_path / "out", reads_rows=0)  # reads: tests/test_reads.py
    systems = result["systems"]
    random_accuracy = systems["random (expected)"]["accuracy"]
    ceiling = systems["bayes_optimal (expected)"]["accuracy"]
    blind = systems["position_blind (expected)"]["accuracy"]
    oracle = systems["oracle (choice model's best pick)"]
    assert systems["knn_tfidf"]["ci_low"] > random_accuracy
    assert systems["ranker"]["ci_low"] > random_accuracy
    for name, s in systems.items():
        if not name.startswith(("bayes_optimal", "oracle")):
            assert s["accuracy"] < ceiling, name
    assert 0.55 < ceiling < 0.75
    # Hiding positions costs the slot-1 preference: about 8 points on the default study.
    assert 0.05 < ceiling - blind < 0.12
    # The oracle is a real predictor: its interval holds the expectation it is drawn from.
    assert oracle["kind"] == "baseline" and oracle["ci_low"] < ceiling < oracle["ci_high"]
    # As simulators: the choice model's exact expected log-loss is the floor; its own
    # probabilities, scored on what people did, land on it within their interval.
    best = systems["bayes_optimal (expected)"]["log_loss"]
    low, high = oracle["log_loss_ci"]
    assert low < best < high
    for name, s in systems.items():
        if s["kind"] == "baseline" and not name.startswith("oracle"):
            assert s["log_loss"] > best and s["slant_tv"] is not None, name
    assert systems["ranker"]["log_loss"] < systems["always_first"]["log_loss"]
    # Under the known choice model: the oracle's distribution is the truth, so its expected
    # log-loss is the ceiling's; every baseline's is above it.
    assert oracle["expected_log_loss"] == pytest.approx(best, abs=1e-3)
    for name, s in systems.items():
        if s["kind"] == "baseline" and not name.startswith("oracle"):
            assert s["expected_log_loss"] > best, name
    # people pick videos leaning their way; position rules cannot simulate that
    assert systems["always_first"]["slant_tv"] > systems["ranker"]["slant_tv"]


def test_tiny_model_in_process_and_served_agree_at_temperature_zero(
    tiny_policy, small_clean, served_tiny_model, tmp_path
):
    served = f"openai:{tiny_policy}@{served_tiny_model}"
    result = run(
        small_clean,
        tmp_path / "out",
        models=[str(tiny_policy), served],
        limit=24,
        max_new_tokens=32,
        batch_size=8,
        samples=2,
        options=PromptOptions(history_depth=3),
    )
    local = result["systems"][tiny_policy.name]
    remote = result["systems"][f"{tiny_policy}@{served_tiny_model}"]
    # transformers serve ignores `logprobs` (transformers/cli/serving/chat_completion.py,
    # UNUSED_CHAT_COMPLETION_FIELDS): the distribution falls back to sampled answers
    assert (
        remote["method"] == "empirical distribution of 2 samples (the server returned no logprobs)"
    )
    assert local["method"].startswith("option-token probabilities (greedy pass")
    assert remote["log_loss"] > 0 and local["log_loss"] > 0
    assert local["accuracy"] == remote["accuracy"]
    assert local["parse_rate"] == remote["parse_rate"] > 0
    table = pq.read_table(tmp_path / "out" / "predictions.parquet").to_pylist()
    by_system = {}
    for record in table:
        by_system.setdefault(record["system"], []).append(record["predicted_index"])
    assert by_system[tiny_policy.name] == by_system[f"{tiny_policy}@{served_tiny_model}"]
    local_replies = [r["completion"] for r in table if r["system"] == tiny_policy.name]
    served_replies = [
        r["completion"] for r in table if r["system"] != tiny_policy.name and r["kind"] == "model"
    ]
    # The warmed-up tiny model thinks nothing: "<think></think><answer>N</answer>". The server's
    # reasoning parser takes the (empty) thought out of the content and sends no reasoning
    # field for it, so the served reply is the rest.
    assert all(c.startswith("<think></think><answer>") for c in local_replies), local_replies[:3]
    assert served_replies == [c.removeprefix("<think></think>") for c in local_replies]


def test_the_command_shows_progress_per_model(small_clean, tiny_policy, tmp_path, capsys):
    out = tmp_path / "o"
    args = ["--data", str(small_clean), "--out", str(out), "--limit", "3"]
    assert main(["benchmark", *args, "--model", str(tiny_policy), "--max-new-tokens", "4"]) == 0
    err = capsys.readouterr().err
    assert "3 validation rows; baselines and ceilings scored" in err
    # each row asked again with its viewer swapped, and with its options swapped (the reads)
    asked = "asking 9 questions (3 rows, 6 with a part swapped: does it read?)"
    for line in (asked, "completions: 0/9", "completions: 9/9", "answered in"):
        assert f"{tiny_policy.name}: {line}" in err, line


def test_unreachable_endpoint_fails_fast_with_one_line(small_clean, tmp_path, capsys):
    started = time.monotonic()
    code = main(
        [
            "benchmark",
            "--data",
            str(small_clean),
            "--out",
            str(tmp_path / "o"),
            "--limit",
            "3",
            "--model",
            f"openai:m@http://127.0.0.1:{free_port()}/v1",
        ]
    )
    assert code == 2 and time.monotonic() - started < 30
    assert "cannot reach http://127.0.0.1:" in capsys.readouterr().err


def test_dry_run_prints_the_request_and_needs_a_key_for_the_openai_api(
    small_clean, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert (
        main(
            [
                "benchmark",
                "--data",
                str(small_clean),
                "--out",
                str(tmp_path / "o"),
                "--limit",
                "3",
                "--model",
                "openai:gpt-4o",
            ]
        )
        == 2
    )
    assert "OPENAI_API_KEY" in capsys.readouterr().err
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    assert (
        main(
            [
                "benchmark",
                "--data",
                str(small_clean),
                "--out",
                str(tmp_path / "o"),
                "--limit",
                "3",
                "--model",
                "openai:gpt-4o",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[dry run] gpt-4o: 3 chat-completions requests to https://api.openai.com/v1" in out
    assert '"temperature": 0' in out and "sk-test" not in out


def test_a_training_output_gives_accuracy_per_step_and_both_charts(
    tiny_policy, small_clean, tmp_path
):
    out = tmp_path / "run"
    train(
        *parse_train_args(
            [
                "--config",
                str(ROOT / "recipes" / "tiny" / "config_grpo.yaml"),
                "--dataset",
                str(small_clean),
                "--model_name_or_path",
                str(tiny_policy),
                "--output_dir",
                str(out),
                "--max_steps",
                "4",
                "--save_steps",
                "1",
                *SMOKE,
            ]
        )
    )
    result = run(
        small_clean,
        tmp_path / "bench",
        models=[str(out)],
        limit=16,
        max_new_tokens=16,
        trained="run",
        branch={"issue": "gun_control", "algorithm": "grpo"},
    )
    steps = sorted(s["step"] for s in result["systems"].values() if s.get("series") == "run")
    assert steps == [0, 1, 2, 3, 4]  # step 0: the model training started from
    assert result["systems"]["run@step-0"]["method"].startswith("option-token probabilities")
    assert result["charts"] == [
        "accuracy_by_model.svg",
        "accuracy_vs_step.svg",
        "log_loss_vs_step.svg",
    ]
    for metric, title in (("accuracy", "Accuracy"), ("log_loss", "Log-loss")):
        step_chart = ET.parse(tmp_path / "bench" / f"{metric}_vs_step.svg").getroot()
        ids = {e.get("id") for e in step_chart.iter() if e.get("id")}
        assert "series-run" in ids and "reference-random (expected)" in ids
        assert "reference-always_first" in ids and "reference-ranker" in ids
        texts = {e.text for e in step_chart.iter(f"{SVG}text")}
        assert "training step (0: the starting model)" in texts
        assert f"{title} vs training step: gun_control, grpo" in texts
    start_minus = result["differences"]["final_minus_start"]
    assert start_minus["log_loss"]["against"] == "run@step-0"
    # small_clean is simulated: the expected log-loss is known too
    assert set(start_minus) == {"accuracy", "log_loss", "expected_log_loss"}
    by_model = ET.parse(tmp_path / "bench" / "accuracy_by_model.svg").getroot()
    ids = {e.get("id") for e in by_model.iter() if e.get("id")}
    for name in result["systems"]:
        assert f"series-{name}" in ids, name
    texts = {e.text for e in by_model.iter(f"{SVG}text")}
    assert "next-video accuracy (95% participant-bootstrap interval)" in texts
    assert "run@step-2" in texts
    report = (tmp_path / "bench" / "report.md").read_text()
    for heading in (
        "## Next-video accuracy",
        "## As a simulator of people",
        "## Did training help?",
        "## By issue and study",
        "## Predicted positions",
        "## By training step (step 0: the starting model)",
        "## Win rates",
    ):
        assert heading in report
    assert "| run | 3 |" in report and "| run | 0 |" in report
    metrics = json.loads((tmp_path / "bench" / "metrics.json").read_text())
    assert metrics["systems"]["run@step-4"]["step"] == 4


def test_opinion_task_and_mlflow_logging(tiny_policy, small_clean, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("bench", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(experiment).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", parent)
    result = run(
        small_clean,
        tmp_path / "out",
        models=[str(tiny_policy)],
        limit=12,
        max_new_tokens=32,
        options=PromptOptions(history_depth=3, opinion=True),
    )
    assert tiny_policy.name in result["opinion"]
    assert any(name.startswith("majority direction") for name in result["opinion"])
    # Scored per participant (their last step), not per step row.
    rows = read_dataset(small_clean, split="validation").to_pylist()[:12]
    people = len({r["participant_id"] for r in rows})
    assert people < 12 and all(o["n"] <= people for o in result["opinion"].values())
    assert result["opinion"]["no change"]["rmse"] >= result["opinion"]["no change"]["mae"]
    logged = client.get_run(parent).data.metrics
    assert logged["baseline/ranker/accuracy"] == result["systems"]["ranker"]["accuracy"]
    assert logged[f"model/{tiny_policy.name}/accuracy"] > -1  # a reference model, by its name
    artifacts = {a.path for a in client.list_artifacts(parent, "benchmark")}
    assert {"benchmark/report.md", "benchmark/accuracy_by_model.svg"} <= artifacts


def test_knn_and_ranker_learn_the_hand_made_rule():
    train, rows = hand_made()
    gold = [r["gold_index"] for r in rows]
    assert knn_tfidf(train, rows).predictions == gold and ranker(train, rows).predictions == gold
    shares = ranker(train, rows).distributions  # the ranker's own probabilities back its picks
    assert all(d[g - 1] == max(d) for d, g in zip(shares, gold, strict=True))


def test_local_models_use_vllm_on_a_gpu_with_vllm_and_transformers_otherwise(monkeypatch):
    """`auto` takes vLLM only on a GPU; a forced vLLM also runs on vLLM's CPU build (the vLLM
    tier runs it for real: tests/test_vllm.py)."""
    import importlib.util

    import torch

    import grail.inference.local as local
    from grail.core.errors import GrailError
    from grail.inference.local import local_backend

    real_find_spec = importlib.util.find_spec
    for gpu, vllm, cpu_build, expected, forced in [
        (True, True, False, "vllm", "vllm"),
        (True, False, False, "transformers", "the vllm package"),
        (False, True, True, "transformers", "vllm"),
        (False, True, False, "transformers", "a CUDA GPU or vLLM's CPU build"),
        (False, False, False, "transformers", "the vllm package"),
    ]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, vllm=vllm: object() if vllm and name == "vllm" else real_find_spec(name),
        )
        monkeypatch.setattr(local, "vllm_runs_on_cpu", lambda cpu_build=cpu_build: cpu_build)
        assert local_backend("auto") == expected
        assert local_backend("transformers") == "transformers"
        if forced == "vllm":
            assert local_backend("vllm") == "vllm"
        else:
            with pytest.raises(GrailError, match=f"--backend vllm needs {forced}"):
                local_backend("vllm")


def test_the_cpu_path_generates_with_transformers(monkeypatch, tiny_policy):
    import grail.inference.local as local

    calls = []
    monkeypatch.setattr(local, "answer_vllm", lambda *a: calls.append("vllm"))
    conversation = [{"role": "user", "content": "OPTIONS\n1. a\n2. b\n3. c"}]
    answers = local.answer_local(str(tiny_policy), [conversation] * 2, [3, 2], 4, 1, "auto")
    assert calls == [] and len(answers.completions) == 2 and isinstance(answers.completions[0], str)
    first, second = answers.distributions  # renormalised over each row's own slate
    assert len(first) == 3 and len(second) == 2
    assert abs(sum(first) - 1) < 1e-9 and abs(sum(second) - 1) < 1e-9
    # the same prompt, fewer options: the same option-token probabilities, renormalised
    assert second[0] / second[1] == pytest.approx(first[0] / first[1], rel=1e-4)


def test_the_greedy_pass_s_logits_give_the_distribution_a_forward_pass_gives(
    tiny_policy, small_clean, monkeypatch
):
    """The choice distribution read from the greedy pass after the model's own ``<answer>``
    equals a second forward pass over the prompt and the reply up to ``<answer>``; replies cut
    before the tag (4 new tokens), and batches whose logits exceed the budget, are scored by
    that forward pass instead."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grail.inference.local as local
    from grail.inference.answers import answer_prefix, renormalised
    from grail.tasks.slate.prompts import option_token_ids, to_example

    rows = read_dataset(small_clean / "validation.parquet").slice(0, 12).to_pylist()
    conversations = [to_example(r, PromptOptions(history_depth=1))["prompt"] for r in rows]
    options = [r["n_options"] for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    numbers = option_token_ids(tokenizer, max(options))

    def forward_pass(completions):
        shares = []
        for conversation, completion, n in zip(conversations, completions, options, strict=True):
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True
            ) + answer_prefix(completion)
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
            with torch.inference_mode():
                last = model(**ids).logits[0, -1].softmax(-1)[numbers].tolist()
            shares.append(renormalised(last[:n]))
        return shares

    whole = local.answer_transformers(str(tiny_policy), conversations, options, 12, 5)
    assert whole.method == "option-token probabilities (greedy pass)"
    assert all("<answer>" in c for c in whole.completions)
    cut = local.answer_transformers(str(tiny_policy), conversations, options, 4, 5)
    assert cut.method.endswith("; forward pass for 12 rows)")
    monkeypatch.setattr(local, "LOGITS_BUDGET", 0)  # logits too large to keep: forward pass
    costly = local.answer_transformers(str(tiny_policy), conversations, options, 12, 5)
    assert costly.method.endswith("; forward pass for 12 rows)")
    assert costly.completions == whole.completions
    for answers in (whole, cut, costly):
        expected = forward_pass(answers.completions)
        for got, want in zip(answers.distributions, expected, strict=True):
            assert got == pytest.approx(want, abs=1e-5)
    assert whole.distributions != cut.distributions  # two different answer positions


def test_a_trained_model_is_asked_the_way_it_was_trained(tiny_policy, small_clean, tmp_path):
    from grail.train.config import parse_train_args
    from grail.train.stage import run as train

    out = tmp_path / "trained"
    trained_with = {"history_depth": 2, "show_ids": False, "shuffle_seed": 7, "opinion": True}
    recipe = ROOT / "recipes" / "tiny" / "config_grpo.yaml"
    trained_with["system_prompt"] = yaml.safe_load(recipe.read_text())["system_prompt"]
    args = ["--config", str(recipe)]
    args += ["--dataset", str(small_clean), "--model_name_or_path", str(tiny_policy)]
    args += ["--output_dir", str(out), "--max_steps", "2", "--save_steps", "2"]
    args += ["--history_depth", "2", "--shuffle_seed", "7", "--opinion_task", "true"]
    args += ["--max_completion_length", "8", "--report_to", "none", *SMOKE]
    train(*parse_train_args(args))
    expected = trained_with | {"max_new_tokens": 8}
    for folder in (out, out / "checkpoint-2"):  # the record names the task; asked without it
        assert json.loads((folder / "prompt.json").read_text()) == {"task": "slate"} | expected
    result = run(small_clean, tmp_path / "bench", models=[str(out)], limit=8)
    models = {n: s for n, s in result["systems"].items() if s["kind"] == "model"}
    assert models and all(s["prompt"] == expected for s in models.values())
    assert result["opinion"]  # trained with the opinion task: scored on it
    told = run(
        small_clean, tmp_path / "b2", models=[str(out)], limit=8, prompt={"history_depth": 5}
    )
    assert all(
        s["prompt"] == expected | {"history_depth": 5}
        for s in told["systems"].values()
        if s["kind"] == "model"
    )
    assert "How each model was asked" in (tmp_path / "bench" / "report.md").read_text()


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ({"reasoning_content": "leans pro"}, "<think>leans pro</think><answer>2</answer>"),
        ({"reasoning": ""}, "<think></think><answer>2</answer>"),
        ({}, "<answer>2</answer>"),
    ],
)
def test_a_reasoning_parser_s_thought_is_put_back_in_front_of_the_reply(extra, text):
    from openai.types.chat import ChatCompletion

    from grail.inference.remote import reply_text

    message = {"role": "assistant", "content": "<answer>2</answer>", **extra}
    reply = ChatCompletion.model_validate(
        {
            "id": "r",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        }
    )
    assert reply_text(reply.choices[0]) == text


def test_the_answer_position_logprobs_of_an_api_reply_give_the_distribution():
    """The OpenAI API's (and vLLM's) reply shape: the token after ``<answer>`` carries the
    option numbers' top logprobs."""
    import math

    from openai.types.chat import ChatCompletion

    from grail.inference.answers import distribution_from_top
    from grail.inference.remote import answer_top

    def token(text, top):
        return {"token": text, "logprob": -0.1, "bytes": None, "top_logprobs": top}

    digits = [
        {"token": "2", "logprob": math.log(0.6), "bytes": None},
        {"token": "1", "logprob": math.log(0.3), "bytes": None},
        {"token": "</", "logprob": math.log(0.05), "bytes": None},
    ]
    tokens = ["<think>", "x", "</think>", "<answer>"]
    reply = ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {
                        "role": "assistant",
                        "content": "<think>x</think><answer>2</answer>",
                    },
                    "logprobs": {
                        "content": [token(t, []) for t in tokens]
                        + [token("2", digits), token("</answer>", [])]
                    },
                }
            ],
        }
    )
    top = answer_top(reply.choices[0])
    assert top is not None and set(top) == {"2", "1", "</"}
    shares = distribution_from_top(top, 3)  # option 3 unseen: at most as likely as the last
    assert shares == pytest.approx([0.3 / 0.95, 0.6 / 0.95, 0.05 / 0.95])
    reply.choices[0].logprobs = None  # a server without logprobs: the caller samples instead
    assert answer_top(reply.choices[0]) is None


def test_one_model_asked_one_way_is_answered_once_under_every_name(
    tiny_policy, small_clean, tmp_path, monkeypatch
):
    """Two runs that start from one model both score it as their step 0: the backend answers
    it once and both names get the same answers; asked another way, it is asked again."""
    from grail.tasks.slate.benchmark import systems as stage

    calls = []
    real = stage.answer_local

    def counted(path, *args):
        calls.append(path)
        return real(path, *args)

    monkeypatch.setattr(stage, "answer_local", counted)
    for name in ("a", "b"):  # two finished runs of nothing, each starting from tiny_policy
        (tmp_path / name).mkdir()
        for file in tiny_policy.iterdir():
            (tmp_path / name / file.name).write_bytes(file.read_bytes())
        (tmp_path / name / "summary.json").write_text(
            json.dumps({"start_model": str(tiny_policy), "global_step": 1})
        )
    result = run(
        small_clean, tmp_path / "bench", models=[str(tmp_path / "a"), str(tmp_path / "b")],
        limit=4, max_new_tokens=4,
    )  # fmt: skip
    assert sorted(calls) == sorted([str(tiny_policy), str(tmp_path / "a"), str(tmp_path / "b")])
    systems = result["systems"]
    assert systems["a@step-0"]["accuracy"] == systems["b@step-0"]["accuracy"]
    calls.clear()
    run(small_clean, tmp_path / "again", models=[str(tiny_policy)], limit=4, max_new_tokens=8)
    assert calls == [str(tiny_policy)]


def test_a_thinking_model_is_read_by_its_mixture_over_sampled_thoughts(
    tiny_policy, small_clean, monkeypatch
):
    """A model that thinks: each row's distribution is the mean, over `thought_samples` replies
    sampled at temperature 1, of the option distribution a forward pass reads after each; the
    greedy reply stays the answer. A model that writes no thought keeps the greedy reading."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grail.inference.local as local
    from grail.inference.answers import answer_prefix, renormalised
    from grail.tasks.slate.prompts import option_token_ids, to_example

    rows = read_dataset(small_clean / "validation.parquet").slice(0, 6).to_pylist()
    conversations = [to_example(r, PromptOptions(history_depth=1))["prompt"] for r in rows]
    options = [r["n_options"] for r in rows]
    greedy = local.answer_transformers(str(tiny_policy), conversations, options, 12, 4, 0)
    # the tiny policy writes <think></think>: it does not think, the greedy reading stands
    same = local.answer_transformers(str(tiny_policy), conversations, options, 12, 4, 3)
    assert same.method == greedy.method == "option-token probabilities (greedy pass)"
    assert same.distributions == greedy.distributions

    # replies with thoughts of different lengths, as a thinking model samples them (the tiny
    # policy's own draws are the real sampling pass; their thoughts replaced, every third left)
    thoughts = ["<think>pro gun</think>", "<think>a viewer who</think><answer>", ""]
    drawn = []
    real = local.generate_transformers

    def sampled(path, conversations, tokens, batch, loaded, scoring, sample=False):
        replies = real(path, conversations, tokens, batch, loaded, scoring, sample=sample)
        if not sample:  # the greedy pass
            return replies
        assert len(replies) == 3 * len(rows)
        scoring[1].clear()  # the replies changed: the forward pass reads every one
        replies = [thoughts[i % 3] + r if i % 3 < 2 else r for i, r in enumerate(replies)]
        drawn.extend(replies)
        return replies

    monkeypatch.setattr(local, "thinks", lambda completions, share: True)
    monkeypatch.setattr(local, "generate_transformers", sampled)
    mixture = local.answer_transformers(str(tiny_policy), conversations, options, 12, 4, 3)
    assert mixture.method.startswith("mixture over 3 sampled thoughts (temperature 1)")
    assert mixture.completions == greedy.completions

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    numbers = option_token_ids(tokenizer, max(options))
    for row, (conversation, n) in enumerate(zip(conversations, options, strict=True)):
        prompt = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
        each = []
        for reply in drawn[3 * row : 3 * row + 3]:
            ids = tokenizer(prompt + answer_prefix(reply), return_tensors="pt",
                            add_special_tokens=False)  # fmt: skip
            with torch.inference_mode():
                last = model(**ids).logits[0, -1].softmax(-1)[numbers].tolist()
            each.append(renormalised(last[:n]))
        assert len({tuple(round(p, 6) for p in d) for d in each}) == 3  # three thoughts, three q
        want = [sum(column) / 3 for column in zip(*each, strict=True)]
        assert mixture.distributions[row] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(
    "uri", ["s3://{b}/x/..", "s3://{b}/x/./y", "s3://{b}//x", "file://{d}/a/.."]
)
def test_a_model_uri_with_dot_segments_is_refused_before_anything_is_downloaded(s3, tmp_path, uri):
    """The probe: `--model s3://bucket/x/..` downloaded checkpoints into the system temp folder
    itself (labelled `..`) and left them there. A '.' or '..' segment is refused, one line."""
    from grail.core.errors import GrailError
    from grail.inference.specs import expand_spec

    spec = uri.format(b=s3, d=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(GrailError, match=r"^--model s3://.*refused|^--model file://.*refused"):
        expand_spec(spec, work)
    assert list(work.iterdir()) == []
