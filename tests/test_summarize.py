"""The summarize task's parts: the synthetic documents, the reader, RepLiQA's layout through
``datasets``, the prompt's budget, the baselines and the benchmark (issue 43)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grail.core.errors import GrailError
from grail.tasks.summarize.baselines import BASELINES, oracle, tfidf_centrality
from grail.tasks.summarize.clean import clean_documents
from grail.tasks.summarize.documents import (
    QUESTIONS_PER_DOCUMENT,
    SALIENT,
    UNANSWERABLE,
    make_document,
    simulate_documents,
)
from grail.tasks.summarize.metrics import score_document, unsupported
from grail.tasks.summarize.prompt import build_messages, kept_sentences, summary_text
from grail.tasks.summarize.reader import answered, binds, split_sentences


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("summarize")
    truth = simulate_documents(root / "raw", documents=240, seed=3)
    audit = clean_documents(root / "raw", root / "clean", validation_documents=60)
    return root, truth, audit


ROOT = Path(__file__).resolve().parents[1]

# ServiceNow/repliqa's dataset card: the `answer` of a question its document cannot answer
# (about 20% of them). Written out here, not imported, so that the test holds grail to the card.
CARD_UNANSWERABLE = "UNANSWERABLE"


def read(path):
    return pq.read_table(path).to_pylist()


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_documents(tmp_path):
    simulate_documents(tmp_path / "a", documents=20, seed=5)
    simulate_documents(tmp_path / "b", documents=20, seed=5)
    simulate_documents(tmp_path / "c", documents=20, seed=6)
    a, b, c = ((tmp_path / x / "repliqa.jsonl").read_bytes() for x in "abc")
    assert a == b != c


def test_a_document_states_its_salient_facts_once_each_and_asks_five_questions():
    import numpy as np

    rng = np.random.default_rng(0)
    for number in range(200):
        doc = make_document(rng, number)
        salient = [s for s, r in zip(doc["sentences"], doc["roles"], strict=True) if r == "salient"]
        assert SALIENT[0] <= len(salient) <= SALIENT[1]
        assert doc["roles"][0] == "salient"  # the opening sentence introduces the entity
        assert len(doc["questions"]) == QUESTIONS_PER_DOCUMENT
        for q in doc["questions"]:
            assert q["entity_aliases"][0] == doc["entity"]
            if q["answer"] == UNANSWERABLE:  # no sentence of the document states it
                assert not any(binds(s, q, answer=False) for s in doc["sentences"])
            else:  # exactly the salient sentences can answer it, never a distractor
                answering = [
                    r for s, r in zip(doc["sentences"], doc["roles"], strict=True) if binds(s, q)
                ]
                assert answering and set(answering) == {"salient"}


def test_the_split_is_by_document_reproducible_and_the_sentences_match_the_truth(study):
    root, truth, audit = study
    train, validation = (
        read(root / "clean" / "train.parquet"),
        read(root / "clean" / "validation.parquet"),
    )
    assert (len(train), len(validation)) == (180, 60)
    assert not {d["document_id"] for d in train} & {d["document_id"] for d in validation}
    for doc in train + validation:
        assert len(doc["sentences"]) == len(truth["roles"][doc["document_id"]])
    assert 0.1 < audit["unanswerable_share"] < 0.3 and audit["deterministic_reader"]
    again = clean_documents(root / "raw", root / "again", validation_documents=60)
    assert read(root / "again" / "validation.parquet") == validation and again == audit


def test_the_reader_needs_entity_cue_and_answer_in_one_sentence():
    q = {"entity_aliases": ["Sarmarul"], "cues": ["population", "inhabit"],
         "answer_aliases": ["6,770", "6770"]}  # fmt: skip
    assert answered("Some 6,770 inhabitants live in Sarmarul.", q)
    assert not answered("Sarmarul is old. Some 6,770 inhabitants live there.", q)
    assert not answered("Sarmarul: 6,770, 701 metres, 27, oats.", q)  # listing numbers
    assert not answered("Some 6,770 inhabitants live in Toviskern.", q)  # another entity
    unanswerable = q | {"answer_aliases": []}
    assert answered("Sarmarul has 27 bridges.", unanswerable)
    assert not answered("Sarmarul has a population of 9,000.", unanswerable)  # invented


def test_split_sentences_keeps_decimals_and_quotes_inside_a_sentence():
    text = (
        "Revenue was 4.2 million crowns. The motto of X is 'Steady hands, open doors'. 12 bridges."
    )
    assert split_sentences(text) == [
        "Revenue was 4.2 million crowns.",
        "The motto of X is 'Steady hands, open doors'.",
        "12 bridges.",
    ]


def test_the_budget_is_stated_in_the_prompt_and_enforced_as_stated():
    messages = build_messages(["A b.", "C d."], "extractive", budget=3)
    assert "at most 3" in messages[0]["content"] and "C d. [b]" in messages[1]["content"]
    assert kept_sentences("<keep>[e][a][a][zz][b][d]</keep>", 5, 3) == [0, 1, 4]
    assert summary_text("no tag", ["A b."], "extractive", 3) is None
    assert "at most 50 characters" in build_messages(["A b."], "abstractive", 50)[0]["content"]
    assert summary_text("<summary>" + "x" * 80 + "</summary>", [], "abstractive", 50) == "x" * 50


def test_the_baselines_keep_the_budget_and_rank_as_the_study_is_built(study):
    root, _, _ = study
    docs = read(root / "clean" / "validation.parquet")
    means = {}
    for name, pick in BASELINES.items():
        kept = [pick(d, 12) for d in docs]
        if name != "full_document":
            assert all(len(k) <= 12 and k == sorted(set(k)) for k in kept)
        scores = [
            score_document(" ".join(d["sentences"][i] for i in k), d)["answered"]
            for d, k in zip(docs, kept, strict=True)
        ]
        means[name] = sum(scores) / len(scores)
    assert means["oracle"] == means["full_document"] == 1.0  # the oracle fits the budget
    assert means["random_k"] < means["tfidf_centrality"] < 1.0
    doc = docs[0]
    assert len(oracle(doc, 2)) == 2 and tfidf_centrality(doc, 100) == list(
        range(len(doc["sentences"]))
    )


def test_unsupported_names_invented_numbers_and_names():
    assert unsupported("Sarmarul has 27 bridges.", "Sarmarul has 27 bridges.") == []
    assert unsupported("Sarmarul has 28 bridges, says Ilse.", "Sarmarul has 27 bridges.") == [
        "28",
        "Ilse",
    ]


def test_repliqa_in_its_own_layout_cleans_through_datasets(tmp_path):
    """A parquet file shaped as RepLiQA is published (no reader columns): answers become their
    own aliases, RepLiQA's unanswerable answer an empty list, and the benchmark says in one line
    that these questions need a model reader."""
    rows = [
        {"document_id": f"d{k // 5}", "document_topic": "News", "document_path": "x.pdf",
         "document_extracted": f"Doc {k // 5} says things. It has 12 lines.",
         "question_id": f"q{k}", "question": "How many lines?",
         "answer": "12" if k % 5 else CARD_UNANSWERABLE, "long_answer": "..."}
        for k in range(20)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "repliqa_0.parquet")
    audit = clean_documents(
        tmp_path / "repliqa_0.parquet", tmp_path / "clean", validation_documents=1
    )
    assert audit["documents"] == 4 and audit["unanswerable_share"] == 0.2
    assert not audit["deterministic_reader"]
    doc = read(tmp_path / "clean" / "validation.parquet")[0]
    assert [q["answer_aliases"] for q in doc["questions"]] == [[]] + [["12"]] * 4
    from grail.tasks.summarize.benchmark import benchmark_documents

    with pytest.raises(GrailError, match="name a model reader"):
        benchmark_documents(tmp_path / "clean", tmp_path / "bench")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"question": ""}, r"row 1: question is missing or empty"),
        ({"cues": "found"}, r"row 1: cues is not a list"),
        ({"document_extracted": "Other text."}, r"row 1: document_extracted differs"),
        # the probe's: clean took these, and the benchmark died on them with a TypeError
        ({"answer_aliases": [1, 2]}, r"row 1: answer_aliases holds 1; expected a list of non"),
        ({"cues": [{"x": 1}]}, r"row 1: cues holds \{'x': 1\}; expected a list of non-empty"),
        ({"entity_aliases": ["a", " "]}, r"row 1: entity_aliases holds ' '; expected a list"),
        # one text under two ids: the two documents could land in both splits
        ({"document_id": "d1", "question_id": "q1"}, r"row 1: document d1 has the text of d"),
        # one question counted twice, or two questions under one id
        ({"question_id": "q0"}, r"row 1: question_id 'q0' is row 0's too"),
        (
            {"document_id": "d1", "document_extracted": "Other.", "question_id": "q0"},
            r"row 1: question_id 'q0' is row 0's too",
        ),
    ],
)
def test_a_bad_row_is_one_line_naming_the_file_row_and_field(tmp_path, row, message):
    good = {"document_id": "d0", "document_extracted": "Text.", "question_id": "q0",
            "question": "What?", "answer": "Text"}  # fmt: skip
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good | {"question_id": "q1"} | row) + "\n")
    with pytest.raises(GrailError, match=message) as err:
        clean_documents(path, tmp_path / "clean", validation_documents=1)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_the_cli_simulates_cleans_and_benchmarks_the_task_and_exits_2_on_bad_input(tmp_path):
    def grail(*args):
        return subprocess.run(
            [sys.executable, "-m", "grail.cli", *args], capture_output=True, text=True
        )

    done = grail(
        "simulate", "--task", "summarize", "--out", str(tmp_path / "raw"), "--documents", "30"
    )
    assert done.returncode == 0, done.stderr
    done = grail("clean", "--task", "summarize", "--raw", str(tmp_path / "raw"),
                 "--out", str(tmp_path / "clean"), "--validation_documents", "10")  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = grail("benchmark", "--task", "summarize", "--data", str(tmp_path / "clean"),
                 "--out", str(tmp_path / "bench"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "bench" / "metrics.json").read_text())
    assert metrics["documents"] == 10 and metrics["systems"]["oracle"]["answered"]["mean"] == 1.0
    assert "| tfidf_centrality | baseline |" in done.stdout
    bad = grail(
        "clean",
        "--task",
        "summarize",
        "--raw",
        str(tmp_path / "nothing"),
        "--out",
        str(tmp_path / "x"),
    )
    assert bad.returncode == 2 and "no .jsonl or .parquet file" in bad.stderr


@pytest.mark.integration
def test_one_grpo_step_on_the_summarize_task_scores_every_summary(study, tiny_policy, tmp_path):
    """The tiny recipe for the task as a user runs it, one step: TRL's GRPOTrainer gets the
    documents' prompts and the task's rewards, and the run's metrics log both; prompt.json says
    how the model was asked."""
    from grail.train.config import parse_train_args
    from grail.train.stage import run as train

    root, _, _ = study
    argv = ["--config", "recipes/tiny/config_summarize.yaml", "--dataset", str(root / "clean")]
    argv += ["--model_name_or_path", str(tiny_policy), "--output_dir", str(tmp_path / "run")]
    argv += [
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "8",
    ]
    summary = train(*parse_train_args(argv))
    assert summary["global_step"] == 1
    assert summary["reward_funcs"] == ["answered_reward", "summary_format_reward"]
    logged = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert any("rewards/answered_reward/mean" in row for row in logged)
    prompt = json.loads((tmp_path / "run" / "prompt.json").read_text())
    assert prompt["task"] == "summarize" and prompt["summary_budget"] == 12


def test_the_task_refuses_what_it_cannot_do_in_one_line(tmp_path):
    from grail.train.config import parse_train_args

    base = ["--config", "recipes/tiny/config_summarize.yaml"]
    with pytest.raises(GrailError, match="unknown reward 'accuracy'.*answered"):
        parse_train_args([*base, "--reward_funcs", "accuracy"])
    with pytest.raises(GrailError, match="gail_use: the summarize task has no discriminator"):
        parse_train_args([*base, "--gail_use", "true", "--gail_model", "x"])
    with pytest.raises(GrailError, match="summary_reader: expected openai:NAME"):
        parse_train_args([*base, "--summary_reader", "gpt-4o"])
    with pytest.raises(GrailError, match="summary_judge: a judge needs a summary_reader"):
        parse_train_args([*base, "--summary_judge", "openai:j@http://127.0.0.1:1/v1"])


def test_a_recipe_with_a_model_reader_trains_on_repliqa_and_records_it(tmp_path):
    """RepLiQA (no deterministic reader's fields) is refused without a reader, and with one the
    examples carry it to the reward and prompt.json to the benchmark."""
    from grail.tasks.summarize.examples import examples as document_examples
    from grail.train.config import parse_train_args
    from grail.train.examples import prompt_record

    clean_documents(_repliqa_parquet(tmp_path), tmp_path / "clean", validation_documents=1)
    base = ["--config", "recipes/tiny/config_summarize.yaml"]
    base += ["--dataset", str(tmp_path / "clean"), "--output_dir", str(tmp_path / "o")]
    config, _ = parse_train_args(base)
    with pytest.raises(GrailError, match="name a model reader"):
        document_examples(config, tmp_path / "clean", "train", None)
    reader = "openai:reader@http://127.0.0.1:8000/v1"
    config, _ = parse_train_args([*base, "--summary_reader", reader])
    examples = document_examples(config, tmp_path / "clean", "train", None)
    assert len(examples) == 3 and {e["summary_reader"] for e in examples} == {reader}
    assert examples[0]["summary_judge"] is None
    assert prompt_record(config)["summary_reader"] == reader


@pytest.mark.integration
def test_a_tiny_summarizer_learns_the_format_and_no_preference(study, tmp_path):
    """grail tiny-model on a study of documents: its tokenizer knows the documents, and the
    format warm-up (replies keeping random sentences) makes greedy replies parse, while
    keeping no fixed set of sentence numbers for every document."""
    from grail.tasks.summarize.benchmark import benchmark_documents
    from grail.train.tiny import build_tiny_model

    root, _, _ = study
    model = build_tiny_model(tmp_path / "tiny", data=root / "clean", format_warmup=120)
    result = benchmark_documents(root / "clean", tmp_path / "bench", models=[str(model)], limit=12)
    entry = result["systems"]["tiny"]
    assert entry["parse_rate"] >= 0.75 and entry["words"] > 0
    kept = [
        json.loads(line)["summary"]
        for line in (tmp_path / "bench" / "summaries.jsonl").read_text().splitlines()
        if json.loads(line)["system"] == "tiny"
    ]
    assert len(set(kept)) > 1


def _repliqa_parquet(folder, documents: int = 4):
    """A parquet file shaped as RepLiQA is published: no deterministic reader's columns."""
    rows = [
        {"document_id": f"d{k // 5}", "document_topic": "News", "document_path": "x.pdf",
         "document_extracted": f"Doc {k // 5} says things. The harbour has 12 cranes.",
         "question_id": f"q{k}", "question": "How many cranes does the harbour have?",
         "answer": "12" if k % 5 else CARD_UNANSWERABLE,
         "long_answer": "12" if k % 5 else "The answer is not found in the document."}
        for k in range(5 * documents)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), folder / "repliqa_0.parquet")
    return folder / "repliqa_0.parquet"


def test_repliqas_unanswerable_is_recognised_and_not_found_is_then_right(tmp_path):
    """RepLiQA marks a question its document cannot answer with the literal UNANSWERABLE: the
    audit counts them, and a reader that says NOT FOUND to one is right, wrong to the others."""
    from grail.tasks.summarize.model_reader import matched

    audit = clean_documents(_repliqa_parquet(tmp_path, 5), tmp_path / "clean", 1)
    assert audit["unanswerable_share"] == 0.2
    documents = [
        d for n in ("train", "validation") for d in read(tmp_path / "clean" / f"{n}.parquet")
    ]
    questions = [q for d in documents for q in d["questions"]]
    verdicts = [matched("NOT FOUND", q) for q in questions]
    assert verdicts.count(True) == 5 and verdicts.count(False) == 20
    # the synthetic study writes the card's literal too, and RepLiQA's long answer beside it
    simulate_documents(tmp_path / "raw", documents=6, seed=3)
    rows = [json.loads(line) for line in (tmp_path / "raw" / "repliqa.jsonl").open()]
    missing = [r for r in rows if not r["answer_aliases"]]
    assert missing and {r["answer"] for r in missing} == {CARD_UNANSWERABLE}
    assert {r["long_answer"] for r in missing} == {"The answer is not found in the document."}


def test_matching_settles_what_it_can_and_leaves_the_rest_to_the_judge():
    from grail.tasks.summarize.model_reader import judge_verdict, matched, token_f1

    gold = {"answer": "The Varnol Works", "answerable": True}
    assert matched("varnol works.", gold) is True  # exact after normalisation
    assert matched("It is the Varnol Works company", gold) is None  # F1 0.67: the judge's
    assert token_f1("It is the Varnol Works company", "The Varnol Works") < 0.8
    assert matched("NOT FOUND", gold) is False
    unanswerable = {"answer": CARD_UNANSWERABLE, "answerable": False}
    assert matched("Not found.", unanswerable) is True
    assert matched("12 cranes", unanswerable) is False  # an invented value is wrong
    assert [judge_verdict(r) for r in ("Yes, it is.", "No", "I think so", "")] == [
        True,
        False,
        None,
        None,
    ]


def test_a_reader_or_judge_failure_is_missing_never_zero(study):
    """A document whose every verdict is missing has no share; the system's share is over
    the documents read, and the missing verdicts are counted."""
    from grail.tasks.summarize.metrics import score_document, summarize_scores, win_rate

    _, _, _ = study
    doc = {"text": "Ostern has 12 bridges.", "questions": [{"answerable": True}] * 2}
    lost = score_document("Ostern has 12 bridges.", doc, [None, None])
    half = score_document("Ostern has 12 bridges.", doc, [True, None])
    right = score_document("Ostern has 12 bridges.", doc, [True, True])
    assert lost["answered"] is None and lost["missing"] == 2
    assert half["answered"] == 1.0 and half["missing"] == 1
    totals = summarize_scores([lost, half, right], ["a", "b", "c"])
    assert totals["answered"]["mean"] == 1.0 and totals["missing_verdicts"] == 3
    rate = win_rate([lost, half], [right, right], ["a", "b"])  # the lost document is skipped
    assert rate["mean"] == 0.5


@pytest.mark.integration
def test_repliqa_is_read_by_a_served_model_reader_and_judge(
    tmp_path, tiny_policy, served_tiny_model
):
    """RepLiQA's questions through a real OpenAI-compatible server (transformers serve): every
    question of every summary asked once, matched or judged, an unclear verdict counted as
    missing; a reader that goes away mid-run leaves verdicts missing, not 0; an unreachable
    one fails before anything is read, in one line."""
    from ports import free_port

    from grail.tasks.summarize.benchmark import benchmark_documents
    from grail.tasks.summarize.model_reader import ModelReader

    clean_documents(_repliqa_parquet(tmp_path), tmp_path / "clean", validation_documents=1)
    spec = f"openai:{tiny_policy}@{served_tiny_model}"
    result = benchmark_documents(
        tmp_path / "clean", tmp_path / "bench", models=[spec], reader=spec, judge=spec
    )
    counts = result["reader"]["counts"]
    systems = result["systems"]
    api = f"{tiny_policy}@{served_tiny_model}"  # an API model, asked the baselines' way
    assert set(systems) == {"lead_k", "random_k", "tfidf_centrality", "full_document", api}
    # the served slate policy answers <answer>N</answer>: no summary, so nothing answered (a
    # reply outside the format is the model's failure, scored 0, not a missing verdict)
    assert systems[api]["parse_rate"] == 0 and systems[api]["failed_requests"] == 0
    assert systems[api]["answered"]["mean"] == 0 and systems[api]["missing_verdicts"] == 0
    assert systems[api]["prompt"]["summary_mode"] == "extractive"
    assert counts["questions"] == 4 * 1 * 5  # systems x documents x questions
    assert counts["matched"] + counts["judged"] == counts["questions"] - counts["reader_failed"]
    missing = sum(s["missing_verdicts"] for s in systems.values())
    assert missing == counts["reader_failed"] + counts["judge_failed"]
    report = (tmp_path / "bench" / "report.md").read_text()
    assert f"read by the reader `{spec}`" not in report and f"reader `{spec}`" in report
    assert f"{missing} verdicts missing" in report
    # the training reward asks the same reader: one share per completion, None for none read
    from grail.tasks.summarize.rewards import answered_reward

    document = read(tmp_path / "clean" / "validation.parquet")[0]
    rewards = answered_reward(
        None,
        ["<keep>[a][b]</keep>", "no summary"],
        [document["sentences"]] * 2,
        [document["questions"]] * 2,
        ["extractive"] * 2,
        [12] * 2,
        summary_reader=[spec] * 2,
        summary_judge=[spec] * 2,
    )
    assert rewards[1] == 0.0 and (rewards[0] is None or 0 <= rewards[0] <= 1)
    gone = ModelReader(f"openai:m@http://127.0.0.1:{free_port()}/v1", retries=0)
    question = {"question": "How many?", "answer": "12", "answerable": True}
    assert gone.read(["It has 12.", None], [[question], [question]]) == [[None], [False]]
    assert gone.counts.reader_failed == 1
    with pytest.raises(GrailError, match="cannot reach http://127.0.0.1"):
        benchmark_documents(
            tmp_path / "clean",
            tmp_path / "bench2",
            reader=f"openai:m@http://127.0.0.1:{free_port()}/v1",
        )
    assert not (tmp_path / "bench2").exists()


def test_a_trained_summarizer_is_benchmarked_with_the_tokens_it_was_trained_to_write(
    study, tmp_path, monkeypatch
):
    """The summarize benchmark reads max_new_tokens from the model's prompt.json (as the
    slate task does), unless --max-new-tokens says otherwise; it used 64 whatever the recipe."""
    import grail.tasks.summarize.benchmark as documents

    root, _, _ = study
    model = tmp_path / "run"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "prompt.json").write_text(json.dumps({"task": "summarize", "max_new_tokens": 80}))
    asked = []

    def fake(spec, docs, prompt, batch, concurrency):
        asked.append(prompt["max_new_tokens"])
        return [None] * len(docs), set()

    monkeypatch.setattr(documents, "model_summaries", fake)
    documents.benchmark_documents(root / "clean", tmp_path / "a", models=[str(model)], limit=2)
    documents.benchmark_documents(
        root / "clean", tmp_path / "b", models=[str(model)], limit=2, max_new_tokens=32
    )
    assert asked == [80, 32]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "raw.jsonl: empty (no rows)"),
        (b'{"document_id": "d0"}\n{"document_extracted": "caf\xe9"}\n', "line 2: not UTF-8"),
        (b"not json at all\n", "raw.jsonl: line 1: not JSON (Expecting value)"),
    ],
    ids=["empty", "latin-1", "not-json"],
)
def test_malformed_files_are_one_line_and_exit_2(tmp_path, capsys, content, message):
    """Before: non-UTF-8 and empty files were stack traces (only DatasetGenerationError was
    caught)."""
    from grail.cli import main

    path = tmp_path / "raw.jsonl"
    path.write_bytes(content)
    argv = ["clean", "--task", "summarize", "--raw", str(path), "--out", str(tmp_path / "c")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err), err


def test_a_document_past_the_size_limit_is_refused_at_clean(tmp_path):
    """Before: a 19 MB document passed clean, and training then tried to allocate 382 GB."""
    from grail.tasks.summarize.clean import MAX_DOCUMENT_CHARACTERS

    row = {"document_id": "d0", "document_extracted": "Word. " * (MAX_DOCUMENT_CHARACTERS // 6 + 1),
           "question_id": "q0", "question": "What?", "answer": "Word"}  # fmt: skip
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(GrailError, match=r"row 0: document_extracted has [\d,]+ characters, more"):
        clean_documents(path, tmp_path / "clean", validation_documents=1)


@pytest.mark.parametrize("budget", ["0", "-2"])
def test_the_benchmarks_summary_budget_is_validated(tmp_path, capsys, budget):
    """Before: 0 silently became 12 sentences and -2 crashed in random_k."""
    from grail.cli import main

    argv = ["benchmark", "--task", "summarize", "--data", str(tmp_path), "--out", "o"]
    assert main([*argv, "--summary_budget", budget]) == 2
    assert "summary_budget: expected at least 1" in capsys.readouterr().err


def test_bootstrap_is_honoured_by_the_summarize_benchmark(tmp_path):
    """Before: 1000 replicates were hard-coded whatever --bootstrap said."""
    from grail.tasks.summarize.benchmark import benchmark_documents
    from grail.tasks.summarize.clean import clean_documents as clean
    from grail.tasks.summarize.documents import simulate_documents

    simulate_documents(tmp_path / "raw", documents=12)
    clean(tmp_path / "raw", tmp_path / "clean", validation_documents=6)
    result = benchmark_documents(tmp_path / "clean", tmp_path / "b", bootstrap=7)
    assert "(7 replicates" in result["intervals"]


class _FlakyReader:
    """A model reader whose reads of the summaries in `lost` all fail (as a timed-out endpoint's
    would); counts what it read the way grail's ModelReader does."""

    def __init__(self, lost):
        from grail.tasks.summarize.model_reader import ReadingCounts

        self.reader, self.judge, self.lost, self.calls = "openai:r@http://x", None, lost, 0
        self.counts = ReadingCounts()

    def read(self, summaries, questions, documents=None):
        self.calls += 1
        verdicts = []
        for k, (summary, asked) in enumerate(zip(summaries, questions, strict=True)):
            failed = summary is not None and k in self.lost
            self.counts.questions += len(asked) * (summary is not None)
            self.counts.reader_failed += len(asked) * failed
            verdicts.append([None if failed else summary is not None] * len(asked))
        return verdicts


def test_a_completion_whose_reads_failed_is_none_from_every_reward(monkeypatch):
    """TRL 1.16 drops a completion only when every reward function returns None (its
    unscorable mask: isnan(rewards_per_func).all(dim=1)); one float from summary_format and it
    trained as if it answered nothing. The batch is read once for all the rewards."""
    import math

    import torch

    from grail.tasks.summarize import rewards

    flaky = _FlakyReader(lost={1})
    monkeypatch.setattr(rewards, "reader_for", lambda reader, judge: flaky)
    monkeypatch.setattr(rewards, "MISSING_AFTER", 1000)
    rewards._LAST_READ.clear()
    doc = ["Ostern has 12 bridges.", "Rain fell."]
    q = [{"question_id": f"q{k}", "question": "How many bridges?"} for k in range(5)]
    batch = dict(
        prompts=None, completions=["<keep>[a]</keep>", "<keep>[b]</keep>", "no format"],
        sentences=[doc] * 3, questions=[q] * 3, summary_mode=["extractive"] * 3,
        summary_budget=[2] * 3, summary_reader=[flaky.reader] * 3, summary_judge=[None] * 3,
    )  # fmt: skip
    table = [rewards.REWARDS[name](**batch) for name in ("answered", "summary_format")]
    per_func = torch.tensor(
        [[math.nan if r is None else r for r in col] for col in zip(*table, strict=True)]
    )
    assert torch.isnan(per_func).all(dim=1).tolist() == [False, True, False]  # TRL's rule
    assert [col[2] for col in table] == [0.0, 0.0]  # no summary: answers nothing, not lost
    assert flaky.calls == 1


def test_training_stops_in_one_line_when_the_reader_fails_past_the_limit(monkeypatch):
    from grail.tasks.summarize import rewards

    flaky = _FlakyReader(lost={0, 1})
    monkeypatch.setattr(rewards, "reader_for", lambda reader, judge: flaky)
    rewards._LAST_READ.clear()
    q = [{"question_id": f"q{k}", "question": "How many?"} for k in range(5)]
    batch = dict(
        prompts=None, completions=["<keep>[a]</keep>"] * 4, sentences=[["A b."]] * 4,
        questions=[q] * 4, summary_mode=["extractive"] * 4, summary_budget=[2] * 4,
        summary_reader=[flaky.reader] * 4,
    )  # fmt: skip
    with pytest.raises(rewards.ReaderFailing, match=r"10 of 20 verdicts missing .* than 20%"):
        rewards.answered_reward(**batch)
    assert rewards.ReaderFailing.exit_code == 1


def test_an_unreachable_reader_is_refused_before_training():
    """The reader is probed with one request before the trainer is built, not found dead by
    the first reward call (a dead reader then trained on the format reward alone)."""
    from types import SimpleNamespace

    from grail.tasks import TASKS

    config = SimpleNamespace(
        summary_reader="openai:reader@http://127.0.0.1:9/v1", summary_judge=None
    )
    with pytest.raises(GrailError, match="reader") as refused:
        TASKS["summarize"].before_training(config, [1.0], None)
    assert "\n" not in str(refused.value)


def test_repliqa_from_the_hub_offline_is_one_line_naming_the_fix(tmp_path):
    """Offline, ``hf:ServiceNow/repliqa`` was a 14-frame ConnectionError trace."""
    import os

    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", "clean", "--task", "summarize",
         "--raw", "hf:ServiceNow/repliqa", "--out", str(tmp_path / "clean")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("grail: error: hf:ServiceNow/repliqa: not readable from the Hugging")
    assert "repliqa_0-00000-of-00001.parquet" in line and not (tmp_path / "clean").exists()


def test_the_judge_sees_the_document_as_summary_rls_does(monkeypatch):
    """The reader answers from the summary alone; the judge, asked only when matching cannot
    settle an answer, sees the document too (Summary-RL's judge does)."""
    from grail.tasks.summarize.model_reader import ModelReader

    asked = []

    def ask(self, spec, prompt):
        asked.append((spec.model, prompt))
        return "about a dozen" if spec.model == "reader" else "yes"

    monkeypatch.setattr(ModelReader, "_ask", ask)
    reader = ModelReader(
        "openai:reader@http://127.0.0.1:9/v1", "openai:judge@http://127.0.0.1:9/v1"
    )
    question = {"question": "How many bridges?", "answer": "12", "answerable": True}
    verdicts = reader.read(
        ["Ostern has twelve bridges."], [[question]], ["DOC: Ostern has 12 bridges."]
    )
    assert verdicts == [[True]]
    (reader_prompt,) = [p for model, p in asked if model == "reader"]
    (judge_prompt,) = [p for model, p in asked if model == "judge"]
    assert "DOC: Ostern" not in reader_prompt and "DOC: Ostern has 12 bridges." in judge_prompt


@pytest.fixture(scope="module")
def served_tiny_summarizer(study, tmp_path_factory):
    """A tiny summarizer (its format warm-up only) behind `transformers serve`: the teacher."""
    from ports import free_port, start_server, stop_server

    from grail.train.tiny import build_tiny_model

    root, _, _ = study
    model = build_tiny_model(
        tmp_path_factory.mktemp("teacher"), data=root / "clean", format_warmup=120
    )
    port = free_port()
    server = start_server(
        [str(Path(sys.executable).parent / "transformers"), "serve", str(model),
         "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        f"http://127.0.0.1:{port}/health",
        "transformers serve",
    )  # fmt: skip
    yield f"openai:{model}@http://127.0.0.1:{port}/v1", model
    stop_server(server)


@pytest.mark.integration
def test_a_teachers_summaries_warm_start_training_as_arts_sft_rl_does(
    study, served_tiny_summarizer, tmp_path
):
    """`grail generate` on a document study asks a served teacher with the training prompt
    (distilabel), keeps each document's best-answering summary, and `sft_dataset` fine-tunes
    on them before GRPO: both phases run from the same recipe."""
    from grail.generate.stage import run as generate
    from grail.tasks.summarize.prompt import build_messages
    from grail.train.config import parse_train_args
    from grail.train.stage import run as train

    root, _, _ = study
    teacher, student = served_tiny_summarizer
    summary = generate(
        root / "clean", tmp_path / "gen", teacher, num_generations=3, limit=8, max_new_tokens=48
    )
    assert summary["task"] == "summarize" and summary["requested"] == 24
    assert summary["generated"] == 24 - summary["failures"] == 24
    assert summary["settings"]["rewards"] == ["answered", "summary_format"]
    generated = read(tmp_path / "gen" / "generated.parquet")
    first = read(root / "clean" / "train.parquet")[0]
    assert generated[0]["prompt"] == build_messages(first["sentences"], "extractive", 12)
    sft = read(tmp_path / "gen" / "sft.parquet")
    by_document: dict[str, list] = {}
    for r in generated:
        by_document.setdefault(r["document_id"], []).append(r)
    for row in sft:  # each document's best parsed summary, once
        group = by_document[row["document_id"]]
        best = max(r["reward"] for r in group if r["parsed"])
        kept = [r for r in group if r["correct"]]
        assert len(kept) == 1 and kept[0]["reward"] == best
        assert row["messages"][-1]["content"] == kept[0]["completion"]
    assert 0 < len(sft) == summary["sft_rows"] <= 8
    argv = ["--config", str(ROOT / "recipes" / "tiny" / "config_summarize.yaml")]
    argv += ["--dataset", str(root / "clean"), "--model_name_or_path", str(student)]
    argv += ["--output_dir", str(tmp_path / "run"), "--sft_dataset", str(tmp_path / "gen")]
    argv += ["--max_steps", "1", "--sft_max_steps", "2", "--report_to", "none"]
    argv += ["--per_device_train_batch_size", "4", "--num_generations", "4"]
    done = train(*parse_train_args(argv))
    assert done["global_step"] == 1
    assert json.loads((tmp_path / "run" / "sft" / "metrics.json").read_text())


def test_a_teachers_summaries_of_repliqa_are_kept_unscored_without_a_reader(tmp_path):
    """RepLiQA's questions need a model reader, which generate does not ask: each document's
    first parsed summary is kept, `answered` left out (not scored 0)."""
    from grail.generate.config import GenerateConfig
    from grail.tasks import TASKS

    clean_documents(_repliqa_parquet(tmp_path, 3), tmp_path / "clean", 1)
    generation = TASKS["summarize"].generation
    config = GenerateConfig(
        data=str(tmp_path / "clean"), out="x", model="openai:t", num_generations=2
    )
    inputs = generation.inputs(tmp_path / "clean", config)
    assert len(inputs) == 4 and "[b]" in inputs[0]["instruction"]  # 2 train documents x 2
    replies = ["no format", "<keep>[b]</keep>", "<keep>[a]</keep>", "<keep>[a][b]</keep>"]
    records = [
        generation.record(i | {"generation": r}, "t", config)
        for i, r in zip(inputs, replies, strict=True)
    ]
    generation.score(records, ["answered", "summary_format"], None)
    assert all("reward_answered" not in r for r in records)
    assert [r["correct"] for r in records] == [False, True, True, False]
    sft, pairs = generation.keep(records)
    assert [row["messages"][-1]["content"] for row in sft] == [replies[1], replies[2]]
    assert len(pairs) == 1  # the first document's parsed summary over its unparsed one


def test_parquet_files_of_clashing_schemas_are_refused(tmp_path):
    """The probe: two RepLiQA parquet files whose columns differ in type were coerced into one
    table silently. Refused in one line naming the file and the column."""
    first = _repliqa_parquet(tmp_path)
    rows = pq.read_table(first).to_pylist()
    other = [
        r
        | {"document_id": f"e{k}", "document_extracted": f"Else {k}.", "question_id": f"x{k}"}
        | {"document_topic": k}
        for k, r in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(other), tmp_path / "repliqa_1.parquet")
    with pytest.raises(GrailError, match=r"repliqa_1.parquet: its columns differ from") as err:
        clean_documents(tmp_path, tmp_path / "clean", validation_documents=1)
    assert "document_topic: int64 here, string there" in str(err.value)
    assert not (tmp_path / "clean").exists()
