"""GRAIL across processes and restarts: one training entry point for the CLI and the KFP task,
two CPU processes (gloo) keep identical discriminator replicas, and a killed run resumes its
discriminator (weights, optimizer, replay buffer, mixing weight) from the object store. GRAIL on
two nodes, as Kubeflow Trainer starts them, is the rehearsal's (tests/rehearsal: the TrainJob's
node command under ZeRO-3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
from test_checkpoints import kill_after_first_upload, resume_in_a_fresh_pod
from tiny_settings import GAIL_SMOKE, SMOKE, classifier_args

from grail.core.checkpoints import complete_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TINY_GRAIL = ROOT / "recipes" / "tiny" / "config_grail.yaml"


def _args(data, model, discriminator, out, *extra):
    """The tiny GRAIL recipe with `discriminator` (a tiny sequence classifier), or with None its
    own (``gail_discriminator: features``)."""
    return [
        "--config",
        str(TINY_GRAIL),
        "--dataset",
        str(data),
        "--model_name_or_path",
        str(model),
        *(classifier_args(discriminator) if discriminator else []),
        "--output_dir",
        str(out),
        "--gail_learnable_weight",
        "true",
        *SMOKE,
        *GAIL_SMOKE,
        *map(str, extra),
    ]


def test_two_cpu_processes_keep_identical_discriminators(tmp_path, tiny_policy, small_clean):
    """The tiny recipe's own discriminator (``features``: a logistic regression on the text's
    crossed features) in two processes; a classifier's replicas, two ZeRO-3 nodes, are the
    rehearsal's TrainJob test."""
    argv = _args(small_clean, tiny_policy, None, tmp_path / "out")
    argv += ["--num_processes", "2", "--max_steps", "2", "--save_strategy", "no"]
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", "train", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
    digests = summary["discriminator_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert summary["discriminator_updates"] > 0  # the replicas moved, and moved together


def test_the_kfp_task_trains_through_the_same_entry_point(monkeypatch, tmp_path, small_clean):
    from grail.components.train.task import train_task

    import grail.train.stage

    seen = []

    def train(argv):
        seen.append(argv)
        out = Path(argv[argv.index("--output_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps([{"step": 1, "loss": 0.5}]))
        return {}

    monkeypatch.setattr(grail.train.stage, "train", train)
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    final = train_task(
        dataset=str(small_clean),
        recipe="recipes/tiny/config_{algorithm}.yaml",
        overrides='{"num_processes": 2}',
        issue="gun_control",
        algorithm="grpo",
        base_models="",
        checkpoint_uri="",
        checkpoint_key="run-1",
        parent="",
        out=str(tmp_path / "model"),
    )
    assert final == {"step": 1.0, "loss": 0.5}
    (argv,) = seen
    assert argv[argv.index("--num_processes") + 1] == "2"


def test_a_killed_grail_run_resumes_its_discriminator_from_s3(
    s3, tmp_path, tiny_policy, tiny_discriminator, small_clean
):
    uri = f"s3://{s3}/runs/grail-killed"
    common = _args(small_clean, tiny_policy, tiny_discriminator, tmp_path / "out")
    common += ["--max_steps", "4", "--save_steps", "2", "--checkpoint_uri", uri]
    kill_after_first_upload(common, uri, hold_at=2)  # held after step 2's save, killed there
    done = complete_checkpoints(uri)
    assert max(done) == 2, "the first run went on past its hold"
    keys = [
        o["Key"]
        for o in boto3.client("s3").list_objects_v2(Bucket=s3, Prefix="runs/grail-killed/")[
            "Contents"
        ]
    ]
    for step in done:
        for name in ("state.json", "buffer.json", "optimizer.pt", "model/model.safetensors"):
            assert f"runs/grail-killed/checkpoint-{step}/discriminator/{name}" in keys
    saved = json.loads(
        boto3.client("s3")
        .get_object(
            Bucket=s3, Key=f"runs/grail-killed/checkpoint-{max(done)}/discriminator/state.json"
        )["Body"]
        .read()
    )
    second = resume_in_a_fresh_pod(common, tmp_path / "out")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    resumed = Path(summary["discriminator_restored_from"])
    assert resumed.name == "discriminator" and resumed.parent.name == f"checkpoint-{max(done)}"
    # The restored counter continues: the updates before the kill plus those after it.
    steps_after = 4 - max(done)
    assert summary["discriminator_updates"] == saved["updates"] + 2 * steps_after
