"""The rehearsal tier (make test-rehearsal, in .venv-vllm: DeepSpeed 0.19.8 and vLLM's CPU
build): the GPU path's own launcher, plan and config on CPU processes.

- The pod plan: `grail train --num_processes 2` with ``DS_ACCELERATOR=cpu`` takes the plan a
  2-GPU pod takes (accelerate + grail/train/accelerate/zero3.yaml), ZeRO-3 over gloo: GRPO, a
  kill and a resume from S3 on both ranks (one download per node), the retry of a finished run.
- The TrainJob node command (``grail train``) on two "nodes" with the PET_* environment
  Kubeflow Trainer's torch plugin sets: one ZeRO-3 GRAIL job (identical discriminator replicas)
  after the SFT warm start, generating without gathered weights
  (``ds3_gather_for_generation: false``), each node uploading its own shards.

What differs from a GPU run, and what stays GPU-only: docs/cluster/gpu.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_settings import GAIL_SMOKE, classifier_args, tiny_args

from grail.core.checkpoints import complete_checkpoints
from grail.core.storage import Location, list_files

pytestmark = pytest.mark.rehearsal
deepspeed = pytest.importorskip("deepspeed", reason="the rehearsal tier runs in .venv-vllm")

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY_GRAIL = ROOT / "recipes" / "tiny" / "config_grail.yaml"
# On CPU: DeepSpeed's CPU accelerator; transformers refuses bf16 without a GPU unless use_cpu
# (which turns DeepSpeed off), so ZeRO-3 runs in fp32 here.
CPU_DEEPSPEED = ["--use_cpu", "false", "--bf16", "false"]


def environment(**extra: str) -> dict[str, str]:
    return (
        os.environ
        | {"DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        | {"PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        | extra
    )


def grail_train(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """`grail train ARGV` as a pod runs it: its own process group (a dying pod takes all)."""
    return subprocess.Popen(
        [str(BIN / "grail"), "train", *argv],
        env=env or environment(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(process: subprocess.Popen, log: Path, timeout: float = 900) -> str:
    try:
        code = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            kill_pod(process.pid)
    text = log.read_text()
    assert code == 0, text[-6000:]
    return text


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), whatever session it started: torch's elastic
    agent starts each rank in a session of its own, so killing the launcher's process group
    leaves the ranks running."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_pod(pid: int) -> None:
    """What a pod's death does: every process in it killed at once (SIGKILL)."""
    for process in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process, signal.SIGKILL)


def shards(uri: str, name: str) -> list[str]:
    """The ZeRO-3 optimizer shards of checkpoint `name` in the object store."""
    keys = list_files(Location.parse(uri).child(name))
    return sorted(k.rsplit("/", 1)[-1] for k in keys if k.endswith("_optim_states.pt"))


def test_the_pod_plan_trains_under_zero3_resumes_on_both_ranks_and_retries_a_finished_run(
    s3, tmp_path, tiny_policy, small_clean
):
    uri = f"s3://{s3}/runs/zero3"
    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", *CPU_DEEPSPEED)
    argv += ["--num_processes", "2", "--max_steps", "4", "--save_steps", "2"]
    argv += ["--checkpoint_uri", uri, "--resume_from_checkpoint", "latest"]
    # The first pod stops after step 2's save (tests/hold) and is killed there (which of several
    # checkpoints "latest" takes: tests/test_checkpoints.py's killed run, in one process).
    killed_at, name = 2, "checkpoint-2"
    hold = {"PYTHONPATH": str(ROOT / "tests" / "hold")}
    hold["GRAIL_TEST_HOLD_AFTER_SAVE"] = str(killed_at)
    first = grail_train(argv, tmp_path / "first.log", environment(**hold))
    deadline = time.monotonic() + 600
    while killed_at not in complete_checkpoints(uri):
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-6000:]
        assert time.monotonic() < deadline, "no checkpoint uploaded in time"
        time.sleep(0.2)
    kill_pod(first.pid)  # the pod dies: launcher and both ranks
    first.wait(timeout=60)
    assert sorted(complete_checkpoints(uri)) == [killed_at]
    # Both ranks' ZeRO-3 shards are in the store, with the gathered 16-bit model.
    assert shards(uri, name) == [
        f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)
    ]

    # A fresh pod (nothing local survives) resumes from the store on both ranks, its second
    # rank slow to write its part of each checkpoint (tests/hold): every rank's RNG state is
    # still in the checkpoint training lists and uploads (the retry below reads the list).
    subprocess.run(["rm", "-rf", str(tmp_path / "out")], check=True)
    late = environment(PYTHONPATH=hold["PYTHONPATH"], GRAIL_TEST_LATE_RANK="3")
    text = finish(grail_train(argv, tmp_path / "second.log", late), tmp_path / "second.log")
    final = list_files(Location.parse(uri).child("checkpoint-4"))
    assert sorted(k.rsplit("/", 1)[-1] for k in final if "rng_state" in k) == [
        f"rng_state_{rank}.pth" for rank in (0, 1)
    ]
    assert text.count(f"downloaded {uri}/{name} into") == 1, "one download per node"
    assert not list((tmp_path / "out").glob(".*partial*"))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 4
    assert summary["resumed_from"].endswith(name)
    assert summary["steps_trained"] == 4 - killed_at
    model = (tmp_path / "out" / "model.safetensors").read_bytes()

    # A retry of the finished run (transformers' DeepSpeed engine never starts): exit 0,
    # nothing trained, the final checkpoint's gathered model as the model.
    (tmp_path / "out" / "model.safetensors").unlink()
    finish(grail_train(argv, tmp_path / "third.log"), tmp_path / "third.log")
    again = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert again["global_step"] == 4 and again["steps_trained"] == 0
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == model


def sft_conversations(clean: Path, out: Path, rows: int = 16) -> Path:
    """A `grail generate`-shaped sft.parquet: prompts of the train split answered with the
    person's actual choice."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grail.tasks.slate.contract import read_dataset
    from grail.tasks.slate.prompts import to_example

    conversations = []
    for row in read_dataset(clean, split="train").to_pylist()[:rows]:
        reply = f"<think></think><answer>{row['gold_index']}</answer>"
        prompt = to_example(row)["prompt"]
        conversations.append({"messages": [*prompt, {"role": "assistant", "content": reply}]})
    out.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(conversations), out / "sft.parquet")
    return out


def test_the_trainjob_node_command_on_two_nodes_trains_one_zero3_job(
    s3, tmp_path, tiny_policy, tiny_discriminator, small_clean
):
    """Two node ranks, each its own disk (output folder) and process tree, with the PET_*
    variables Trainer sets (its torch plugin: pkg/runtime/framework/plugins/torch/torch.go,
    EnforceMLPolicy), the master on 127.0.0.1: one GRAIL job of world size 2 with identical
    discriminator replicas, each node's shards in the store.

    It also runs the SFT warm start (on `grail generate`-shaped conversations) under ZeRO-3 and
    generates without gathered weights (``ds3_gather_for_generation: false``): generation's
    forwards then gather each layer's weights collectively, so a rank that ran one forward
    fewer would leave the other waiting: the run finishes. (One launch for both: a second
    2-rank GRAIL run of the pod plan cost the tier about 70 s; the pod plan itself is the
    first test's.)"""
    from grail.components.train.trainjob import NODE_COMMAND
    from ports import free_port
    from safetensors.torch import load_file

    uri = f"s3://{s3}/runs/nodes"
    sft = sft_conversations(small_clean, tmp_path / "gen")
    trainer = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
    }
    nodes = []
    for rank in (0, 1):
        out = tmp_path / f"node-{rank}"
        argv = tiny_args(small_clean, tiny_policy, out, *CPU_DEEPSPEED, recipe=TINY_GRAIL)
        argv += [*classifier_args(tiny_discriminator), *GAIL_SMOKE]
        argv += ["--max_steps", "2", "--save_steps", "2", "--checkpoint_uri", uri]
        argv += ["--sft_dataset", str(sft), "--ds3_gather_for_generation", "false"]
        env = environment(**trainer, PET_NODE_RANK=str(rank))
        command = [str(BIN / NODE_COMMAND[0]), *NODE_COMMAND[1:], *argv]
        log = tmp_path / f"node-{rank}.log"
        process = subprocess.Popen(
            command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        nodes.append((process, log))
    texts = [finish(process, log) for process, log in nodes]
    assert all("trained 2 steps on 2 process(es)" in text for text in texts[:1])
    summary = json.loads((tmp_path / "node-0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
    assert summary["sft_model"].endswith("sft")
    digests = summary["discriminator_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1] and summary["discriminator_updates"]
    assert sorted(complete_checkpoints(uri)) == [2]
    keys = list_files(Location.parse(uri).child("checkpoint-2"))
    assert {"_COMPLETE.node-0-of-2.json", "_COMPLETE.node-1-of-2.json"} <= set(keys)
    assert shards(uri, "checkpoint-2") == [
        f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)
    ]
    # the behaviour-cloning warm start, written on node 0 alone, reached node 1 through the store
    assert "model.safetensors" in list_files(Location.parse(uri).child("sft"))
    assert (tmp_path / "node-1" / "sft" / "model.safetensors").is_file()
    # Saved under ZeRO-3 with the gathered weights: every tensor at the base model's shape
    # (model.save_pretrained on the partitioned module wrote empty ones).
    base = load_file(tiny_policy / "model.safetensors")
    warm = load_file(tmp_path / "node-0" / "sft" / "model.safetensors")
    assert {k: v.shape for k, v in warm.items()} == {k: v.shape for k, v in base.items()}
    assert any(not (warm[k] == base[k]).all() for k in base), "the warm start trained"
