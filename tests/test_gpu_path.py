"""The GPU path's defects that a CPU can show: the precision a single process trains in, the
SFT warm start's loss mask, checkpoints downloaded once and whole, and markers per node.
(The launcher and ZeRO-3 themselves: tests/test_multigpu.py and the rehearsal tier.)"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tiny_settings import tiny_args

from grail.core.checkpoints import (
    complete_checkpoints,
    download_latest,
    upload_complete,
)
from grail.core.storage import Location
from grail.train.config import parse_train_args
from grail.train.trainer import build_trainer

ROOT = Path(__file__).resolve().parents[1]
GPU_RECIPE = ROOT / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_grpo_gun.yaml"


def recipe_value(name: str):
    import yaml

    return yaml.safe_load(GPU_RECIPE.read_text())[name]


def test_one_step_of_the_one_gpu_precision_setup_moves_the_weights(
    tmp_path, tiny_policy, small_clean
):
    """The 1-GPU default trains in this process (no DeepSpeed) with the recipe's dtype bfloat16,
    bf16 and learning rate. Loaded in bf16, an Adam step of ~1e-6 rounded away: 2% of the
    weights moved, no LayerNorm weight. Now the weights are fp32 masters under bf16 autocast."""
    dtype, lr = recipe_value("dtype"), recipe_value("learning_rate")
    assert (dtype, recipe_value("bf16")) == ("bfloat16", True)
    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--max_steps", "1")
    argv += ["--dtype", dtype, "--bf16", "true", "--learning_rate", str(lr)]
    argv += ["--save_strategy", "no", "--lr_scheduler_type", "constant", "--beta", "0"]
    # 2 prompts x 8 completions: groups whose rewards differ, so the step has a gradient (the
    # accuracy reward: with empty thoughts every completion of a prompt has the same log score)
    argv += ["--per_device_train_batch_size", "16", "--num_generations", "8", "--seed", "3"]
    argv += ["--reward_funcs", "accuracy", "format", "tag_count"]
    config, model_config = parse_train_args(argv)
    trainer, _ = build_trainer(config, model_config)
    weights = {
        name: p.detach().clone()
        for name, p in trainer.model.named_parameters()
        if "embed" not in name and "lm_head" not in name
    }
    trainer.train()
    assert trainer.state.log_history[0]["grad_norm"] > 0
    after = dict(trainer.model.named_parameters())
    moved = sum(int((after[n].detach() != w).sum()) for n, w in weights.items())
    total = sum(w.numel() for w in weights.values())
    norms = [n for n in weights if "norm" in n]
    assert moved / total >= 0.95, f"{moved / total:.3f} of the weights moved"
    assert all((after[n].detach() != weights[n]).any() for n in norms)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


def test_the_sft_warm_start_trains_on_the_reply_only(
    monkeypatch, tmp_path, tiny_policy, small_clean
):
    """The loss covers the assistant's reply, not the ~470 prompt tokens before it."""
    import trl

    from grail.train.sft import sft_warm_start

    rehearsal = ROOT / "tests" / "rehearsal"
    monkeypatch.syspath_prepend(str(rehearsal))
    from test_rehearsal import sft_conversations

    sft = sft_conversations(small_clean, tmp_path / "gen", rows=4)
    seen = {}

    def train(self, *args, **kwargs):
        seen["trainer"] = self

    monkeypatch.setattr(trl.SFTTrainer, "train", train)
    argv = tiny_args(small_clean, tiny_policy, tmp_path / "out", "--sft_dataset", str(sft))
    config, model_config = parse_train_args(argv)
    out = Path(sft_warm_start(config, model_config))
    assert (out / "model.safetensors").is_file()
    trainer = seen["trainer"]
    batch = trainer.data_collator([trainer.train_dataset[0]])
    labels = batch["labels"][0]
    scored = labels[labels != -100]
    tokenizer = trainer.processing_class
    reply = tokenizer.decode(scored)
    assert "<answer>" in reply and "OPTIONS" not in reply and "VIEWER" not in reply
    assert len(scored) < len(labels) / 4  # the prompt is most of the tokens, and unscored


def _checkpoint(folder: Path, step: int, rank: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"zero_pp_rank_{rank}_optim_states.pt").write_bytes(b"s" * (rank + 5))
    if rank == 0:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_a_checkpoint_across_nodes_is_complete_only_with_every_nodes_marker(tmp_path):
    """Each node saves its own ZeRO-3 shards on its own disk and uploads them with its own
    marker; before, only rank 0 uploaded, and node 1's shards never reached the store."""
    uri = f"file://{tmp_path / 'store'}"
    target = Location.parse(uri).child("checkpoint-2")
    upload_complete(_checkpoint(tmp_path / "n0" / "checkpoint-2", 2, 0), target, 2, 0, 2)
    assert complete_checkpoints(uri) == {}, "node 1's shards are not there yet"
    upload_complete(_checkpoint(tmp_path / "n1" / "checkpoint-2", 2, 1), target, 2, 1, 2)
    assert complete_checkpoints(uri) == {2: "checkpoint-2"}
    local = download_latest(uri, tmp_path / "resume")
    assert sorted(p.name for p in local.iterdir()) == [
        "trainer_state.json",
        "zero_pp_rank_0_optim_states.pt",
        "zero_pp_rank_1_optim_states.pt",
    ]


def test_a_downloaded_checkpoint_is_found_not_deleted_and_fetched_again(tmp_path, monkeypatch):
    """The node's other processes (after its first, TrainingArguments.main_process_first) find
    the checkpoint whole; before, each rank deleted the folder and downloaded it again while
    the others were loading it."""
    import grail.core.checkpoints as checkpoints

    uri = f"file://{tmp_path / 'store'}"
    folder = _checkpoint(tmp_path / "saved" / "checkpoint-4", 4, 0)
    upload_complete(folder, Location.parse(uri).child("checkpoint-4"), 4)
    first = download_latest(uri, tmp_path / "out")
    inode = (first / "trainer_state.json").stat().st_ino
    calls = []
    monkeypatch.setattr(checkpoints, "download_folder", lambda *a: calls.append(a))
    again = download_latest(uri, tmp_path / "out")
    assert again == first and calls == []
    assert (again / "trainer_state.json").stat().st_ino == inode
    assert not list((tmp_path / "out").glob(".*"))  # no partial or stale folders left


def test_the_model_artifact_keeps_models_not_resume_state(tmp_path):
    """The KFP model artifact of a run with checkpoint_uri: every checkpoint's model stays (the
    benchmark scores each), its optimizer and ZeRO-3 shards go (~50 GB per 1.5B branch with
    save_total_limit 2; checkpoint_uri holds them for resumes)."""
    from grail.train.stage import drop_resume_state

    checkpoint = tmp_path / "checkpoint-50"
    (checkpoint / "global_step50").mkdir(parents=True)
    (checkpoint / "discriminator").mkdir()
    resume = ["optimizer.pt", "scheduler.pt", "rng_state_0.pth", "latest", "zero_to_fp32.py"]
    resume += ["global_step50/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    resume += ["discriminator/optimizer.pt"]
    kept = ["model.safetensors", "config.json", "trainer_state.json", "prompt.json"]
    kept += ["discriminator/state.json"]
    for name in resume + kept:
        (checkpoint / name).write_bytes(b"x" * 10)
    (tmp_path / "model.safetensors").write_bytes(b"final")
    assert drop_resume_state(tmp_path) == 10 * len(resume)
    left = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
    assert left == sorted(kept) and (tmp_path / "model.safetensors").is_file()


def test_a_rank_leaves_its_process_group_when_training_returns(tmp_path):
    """The rank tears its process group down itself (a gloo group left to the interpreter's
    exit aborted a TrainJob node's rank after it had saved); without one, nothing happens."""
    import torch.distributed as dist

    from grail.train.stage import leave_process_group

    leave_process_group()  # none: a single process
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    assert dist.is_initialized()
    leave_process_group()
    assert not dist.is_initialized()


def test_the_other_ranks_check_the_output_dir_only_after_the_main_process_claimed_it(
    tmp_path, monkeypatch
):
    """CI's rehearsal (two ranks under ZeRO-3): rank 1 read ``output_dir`` while rank 0 had its
    claim staged (``._WRITER.json.<pid>`` there, no ``_WRITER.json`` yet), took the folder for
    another's and stopped the run. The other ranks check it after the main process's claim
    (TrainingArguments.main_process_first, ``local=False``). Two threads stand for the ranks;
    the barrier is transformers' own (the replicas wait before, the main process after)."""
    import contextlib
    import os
    import threading
    from types import SimpleNamespace

    import grail.core.outputs as outputs
    from grail.train.stage import claim_output_dir

    barrier, staged, looked = threading.Barrier(2, timeout=30), threading.Event(), threading.Event()
    write_claim, check_owned = outputs._write_claim, outputs.check_owned

    def paused_claim(out, *args):  # rank 0 holds its claim staged until rank 1 looked (or 1 s)
        (out / f".{outputs.CLAIM}.{os.getpid()}").write_text("{}\n")
        staged.set()
        looked.wait(1)
        write_claim(out, *args)

    def rank_1_check(out, command):
        if threading.current_thread().name != "rank-1":
            return check_owned(out, command)
        staged.wait(5)
        try:
            return check_owned(out, command)
        finally:
            looked.set()

    monkeypatch.setattr(outputs, "_write_claim", paused_claim)
    monkeypatch.setattr(outputs, "check_owned", rank_1_check)
    errors = {}

    def rank(index: int) -> None:
        @contextlib.contextmanager
        def main_process_first(local=True, desc="work"):
            main = index == 0  # two ranks of one node: local or not, rank 0 is the main one
            try:
                if not main:
                    barrier.wait()
                yield
            finally:
                if main:
                    barrier.wait()

        config = SimpleNamespace(
            output_dir=str(tmp_path / "out"), dataset=None, sft_dataset=None, sft_teacher=None,
            sft_reuse=None, discriminator_model=None, process_index=index,
            resume_from_checkpoint=None, checkpoint_uri=None,
            main_process_first=main_process_first,
        )  # fmt: skip
        try:
            claim_output_dir(config, SimpleNamespace(model_name_or_path=None))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors[index] = error

    threads = [threading.Thread(target=rank, args=(i,), name=f"rank-{i}") for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == {} and staged.is_set() and looked.is_set(), errors
    assert (tmp_path / "out" / outputs.CLAIM).is_file()
