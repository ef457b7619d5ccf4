"""Stage generate (distilabel against `transformers serve` on 127.0.0.1) and the SFT warm-start."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from ports import free_port

from grail.cli import main
from grail.generate.stage import run
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.prompts import PromptOptions
from grail.train.config import parse_train_args
from grail.train.stage import run as train

ROOT = Path(__file__).resolve().parents[1]
SHORT = PromptOptions(history_depth=3)


def _generate(small_clean, out, url, tiny_policy, **kwargs):
    settings = {"num_generations": 3, "limit": 6, "max_new_tokens": 32, "options": SHORT}
    return run(small_clean, out, f"openai:{tiny_policy}@{url}", **(settings | kwargs))


def test_generate_writes_four_consistent_outputs(
    small_clean, tiny_policy, served_tiny_model, tmp_path
):
    summary = _generate(small_clean, tmp_path / "gen", served_tiny_model, tiny_policy)
    assert summary["requested"] == 6 * 3
    assert summary["generated"] == summary["requested"] - summary["failures"] == 18
    generated = pq.read_table(tmp_path / "gen" / "generated.parquet").to_pylist()
    assert len(generated) == 18
    assert {(r["session_id"], r["step_index"]) for r in generated}.__len__() == 6
    assert sorted(r["generation_index"] for r in generated) == sorted([0, 1, 2] * 6)
    first = generated[0]
    for column in (
        "prompt",
        "completion",
        "parsed_answer",
        "reward",
        "reward_accuracy",
        "reward_format",
        "model",
        "temperature",
        "max_new_tokens",
        "gold_index",
    ):
        assert column in first, column
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert "OPTIONS\n1. " in first["prompt"][1]["content"]
    correct = [r for r in generated if r["correct"]]
    assert all(r["reward_accuracy"] == 1.0 for r in correct)
    sft = pq.read_table(tmp_path / "gen" / "sft.parquet").to_pylist()
    assert len(sft) == len(correct) == summary["sft_rows"] == summary["correct"]
    for conversation in sft:
        assert [m["role"] for m in conversation["messages"]] == ["system", "user", "assistant"]
    pairs = pq.read_table(tmp_path / "gen" / "preferences.parquet").to_pylist()
    by_prompt = {}
    for r in generated:
        by_prompt.setdefault((r["session_id"], r["step_index"]), []).append(r["correct"])
    expected_pairs = sum(flags.count(False) for flags in by_prompt.values() if any(flags))
    assert len(pairs) == expected_pairs == summary["preference_pairs"]
    by_text = {(r["session_id"], r["step_index"], r["completion"]): r["correct"] for r in generated}
    for pair in pairs:
        key = (pair["session_id"], pair["step_index"])
        assert by_text[key + (pair["chosen"][0]["content"],)] is True
        assert by_text[key + (pair["rejected"][0]["content"],)] is False
    assert summary["acceptance_rate"] == round(len(correct) / 18, 4)
    assert summary["parse_rate"] > 0.5
    written = json.loads((tmp_path / "gen" / "summary.json").read_text())
    assert written["generated"] == 18 and written["failures"] == 0


class FlakyProxy(BaseHTTPRequestHandler):
    """Forwards to the real server, but answers 500 to the first `fail_first` chat requests and
    to every request whose body contains `poison`."""

    upstream, poison, fail_first = "", None, 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            poisoned = self.poison is not None and self.poison.encode() in body
            failing = poisoned or FlakyProxy.fail_first > 0
            FlakyProxy.fail_first -= FlakyProxy.fail_first > 0
        if failing:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "injected"}')
            return
        request = urllib.request.Request(
            self.upstream + self.path, data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            payload = reply.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):  # noqa: N802
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky(served_tiny_model):
    FlakyProxy.upstream = served_tiny_model.removesuffix("/v1")
    FlakyProxy.poison, FlakyProxy.fail_first = None, 0
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), FlakyProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_failed_batches_are_retried(small_clean, tiny_policy, flaky, tmp_path):
    FlakyProxy.fail_first = 4  # transient: the retry one request at a time succeeds
    summary = _generate(small_clean, tmp_path / "gen", flaky, tiny_policy, retries=0)
    assert summary["failures"] == 0 and summary["generated"] == 18


def test_requests_that_keep_failing_are_counted_never_empty_rows(
    small_clean, tiny_policy, flaky, tmp_path
):
    template = tmp_path / "t.jinja"  # the session id in the prompt lets the proxy pick a row
    template.write_text(
        "Session {{ row.session_id }} step {{ row.step_index }}.\n\nOPTIONS\n"
        "{% for o in row.slate %}{{ loop.index }}. {{ o.title }}\n{% endfor %}"
    )
    first = read_dataset(small_clean, split="train").slice(0, 1).to_pylist()[0]
    FlakyProxy.poison = f"Session {first['session_id']} step {first['step_index']}."
    summary = _generate(
        small_clean, tmp_path / "gen", flaky, tiny_policy, retries=0, template=str(template)
    )
    assert summary["failures"] == 3  # the poisoned row's three generations
    assert summary["generated"] == 18 - 3
    generated = pq.read_table(tmp_path / "gen" / "generated.parquet").to_pylist()
    assert len(generated) == 15 and all(r["completion"] is not None for r in generated)
    kept = {(r["session_id"], r["step_index"]) for r in generated}
    assert (first["session_id"], first["step_index"]) not in kept and len(kept) == 5


def test_wrong_endpoint_fails_fast_with_one_line(small_clean, tmp_path, capsys):
    started = time.monotonic()
    code = main(
        [
            "generate",
            "--data",
            str(small_clean),
            "--out",
            str(tmp_path / "g"),
            "--model",
            f"openai:m@http://127.0.0.1:{free_port()}/v1",
            "--limit",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - started < 10
    assert err.startswith("grail: error: m@http://127.0.0.1:") and "cannot reach" in err
    assert err.count("\n") == 1
    assert (
        main(
            [
                "generate",
                "--data",
                str(small_clean),
                "--out",
                str(tmp_path / "g"),
                "--model",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "serve the model" in capsys.readouterr().err


def test_template_replaces_the_user_prompt(small_clean, tiny_policy, served_tiny_model, tmp_path):
    template = tmp_path / "prompt.jinja"
    template.write_text(
        "Pick for a {{ row.viewer.pid1 }} viewer.\n\nOPTIONS\n"
        "{% for o in row.slate %}{{ loop.index }}. {{ o.title }}\n{% endfor %}"
    )
    _generate(
        small_clean,
        tmp_path / "gen",
        served_tiny_model,
        tiny_policy,
        limit=2,
        num_generations=1,
        template=str(template),
    )
    generated = pq.read_table(tmp_path / "gen" / "generated.parquet").to_pylist()
    assert all(r["prompt"][1]["content"].startswith("Pick for a ") for r in generated)
    assert generated[0]["template"] == str(template)
    template.write_text("{{ row.nope }}")
    with pytest.raises(Exception, match=r"prompt.jinja: .*nope"):
        _generate(
            small_clean,
            tmp_path / "gen2",
            served_tiny_model,
            tiny_policy,
            limit=1,
            num_generations=1,
            template=str(template),
        )


def test_sft_warm_start_runs_both_phases(
    small_clean, tiny_policy, served_tiny_model, tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient

    _generate(small_clean, tmp_path / "gen", served_tiny_model, tiny_policy, limit=8)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "sft-then-grpo")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "false")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    summary = train(
        *parse_train_args(
            [
                "--config",
                str(ROOT / "recipes" / "tiny" / "config_grpo_sft.yaml"),
                "--dataset",
                str(small_clean),
                "--model_name_or_path",
                str(tiny_policy),
                "--sft_dataset",
                str(tmp_path / "gen"),
                "--output_dir",
                str(tmp_path / "out"),
                "--max_steps",
                "2",
                "--sft_max_steps",
                "3",
                "--report_to",
                "mlflow",
            ]
        )
    )
    assert summary["sft_model"] == str(tmp_path / "out" / "sft")
    sft_rows = json.loads((tmp_path / "out" / "sft" / "metrics.json").read_text())
    assert [r["step"] for r in sft_rows] == [1, 2, 3] and all("loss" in r for r in sft_rows)
    grpo_rows = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [r["step"] for r in grpo_rows] == [1, 2] and "reward" in grpo_rows[0]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sft-then-grpo")
    runs = client.search_runs([experiment.experiment_id])
    child = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(runs) == 2 and len(child) == 1 and child[0].info.run_name == "sft"
    parent = child[0].data.tags["mlflow.parentRunId"]
    assert [m.step for m in client.get_metric_history(child[0].info.run_id, "loss")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(parent, "reward")] == [1, 2]


def test_a_run_where_every_request_failed_exits_1_and_marks_nothing_complete(
    small_clean, tiny_policy, flaky, tmp_path, capsys
):
    """The probe: `--max_new_tokens -1` made every request fail, and the run exited 0 with an
    output marked complete holding 0 rows. Every request failing (here the server's 500s)
    exits 1 in one line, writing nothing; the bad value itself is refused before any request."""
    FlakyProxy.fail_first = 10**6
    out = tmp_path / "gen"
    argv = ["generate", "--data", str(small_clean), "--out", str(out), "--limit", "2"]
    argv += ["--model", f"openai:{tiny_policy}@{flaky}", "--batch_retries", "0"]
    argv += ["--retries", "0", "--num_generations", "1"]
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert "every one of the 2 requests failed" in lines[-1] and "Traceback" not in "".join(lines)
    assert not out.exists()
    FlakyProxy.fail_first = 0
    for bad in (["--max_new_tokens", "-1"], ["--max_new_tokens", "0"], ["--batch_size", "0"]):
        assert main(argv + bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{bad[0][2:]}: expected at least 1" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("where", ["root", "someone's folder", "unwritable"])
def test_an_out_generate_may_not_write_is_refused_before_any_request(
    small_clean, tiny_policy, flaky, tmp_path, capsys, where
):
    """The probe: `grail generate --out /` was refused only after the whole generation, having
    created `/..distilabel/`. Refused first now: no request reaches the server."""
    import os

    if where == "unwritable" and os.geteuid() == 0:
        pytest.skip("root writes any folder: the permission check cannot refuse here")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o500 if where == "unwritable" else 0o755)
    if where == "someone's folder":
        (mine / "notes.txt").write_text("mine\n")
    out = {"root": Path("/"), "someone's folder": mine, "unwritable": mine / "gen"}[where]
    FlakyProxy.fail_first = 10**6  # a request that reached the server would fail: counted
    argv = ["generate", "--data", str(small_clean), "--out", str(out), "--limit", "2"]
    argv += ["--model", f"openai:{tiny_policy}@{flaky}", "--num_generations", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grail: error: "), err
    assert FlakyProxy.fail_first == 10**6  # not one request sent
    assert not Path("/..distilabel").exists() and not (tmp_path / ".mine.distilabel").exists()
