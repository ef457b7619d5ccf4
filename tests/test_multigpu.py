"""Multi-GPU launch: the commands `grail train` runs for 1, 2 and 8 GPUs in both vLLM modes,
on several TrainJob nodes, and the precision a single process trains in."""

from __future__ import annotations

import pytest
import yaml

from grail.core.errors import GrailError
from grail.train.multigpu import LAUNCHED, ZERO3, Nodes, launch_plan, plan_for, tool

ARGV = ["--config", "recipes/Qwen2.5-1.5B-Instruct/grpo/config_grail_gun.yaml"]
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_one_gpu_trains_in_process(mode):
    assert launch_plan(ARGV, 1, mode, MODEL) == []
    assert launch_plan(ARGV, 0, mode, MODEL) == []


@pytest.mark.parametrize("gpus", [2, 8])
def test_colocate_trains_on_every_gpu_under_zero3(gpus):
    (trainer,) = launch_plan(ARGV, gpus, "colocate", MODEL)
    assert trainer.command == [
        tool("accelerate"),
        "launch",
        "--config_file",
        str(ZERO3),
        "--num_processes",
        str(gpus),
        "--mixed_precision",
        "bf16",
        "-m",
        "grail.cli",
        "train",
        *ARGV,
    ]
    assert trainer.env == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))), LAUNCHED: "1"}


@pytest.mark.parametrize(("gpus", "training"), [(2, "0"), (8, "0,1,2,3,4,5,6")])
def test_server_mode_serves_on_the_last_gpu_and_trains_on_the_rest(gpus, training):
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    server, trainer = launch_plan(ARGV, gpus, "server", MODEL, port=8123)
    # vLLM's own server as TRL 1.16 builds it (`trl vllm-serve` only execs this, deprecated)
    expected = build_command(ScriptArguments(model=MODEL, host="127.0.0.1", port=8123))
    assert server.command == expected and server.command[3] == "serve"
    assert "--weight-transfer-config" in server.command
    assert server.env == {"CUDA_VISIBLE_DEVICES": str(gpus - 1), "VLLM_SERVER_DEV_MODE": "1"}
    assert server.health == "http://127.0.0.1:8123/health"
    assert trainer.command[:6] == [
        tool("accelerate"),
        "launch",
        "--config_file",
        str(ZERO3),
        "--num_processes",
        str(gpus - 1),
    ]
    assert trainer.command[-4:] == ["--vllm_server_host", "127.0.0.1", "--vllm_server_port", "8123"]
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == training


def test_without_vllm_server_mode_is_ignored():
    (trainer,) = launch_plan(ARGV, 8, "server", MODEL, use_vllm=False)
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_the_shipped_zero3_config_is_deepspeed_stage_3():
    config = yaml.safe_load(ZERO3.read_text())
    assert config["distributed_type"] == "DEEPSPEED"
    assert config["deepspeed_config"]["zero_stage"] == 3


def test_trainjob_nodes_span_one_zero3_plan_from_trainers_environment():
    """The PET_* variables Kubeflow Trainer's torch plugin sets on node 1 of 2 (8 GPUs each):
    accelerate's machine rank, master and 16 processes, under the same ZeRO-3 config."""
    nodes = Nodes.from_environment(
        {
            "PET_NNODES": "2",
            "PET_NODE_RANK": "1",
            "PET_MASTER_ADDR": "job-node-0-0.job",
            "PET_MASTER_PORT": "29400",
            "PET_NPROC_PER_NODE": "auto",
        }
    )
    (trainer,) = launch_plan(ARGV, 8, "colocate", MODEL, nodes=nodes)
    command = trainer.command
    assert command[2:4] == ["--config_file", str(ZERO3)]
    flags = dict(zip(command[4 : -len(ARGV) - 3 : 2], command[5 : -len(ARGV) - 3 : 2], strict=True))
    assert flags == {
        "--num_processes": "16",
        "--num_machines": "2",
        "--machine_rank": "1",
        "--main_process_ip": "job-node-0-0.job",
        "--main_process_port": "29400",
        "--mixed_precision": "bf16",
    }
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_server_mode_across_nodes_is_refused_in_one_line():
    with pytest.raises(GrailError, match="vllm_mode server on 2 nodes"):
        launch_plan(ARGV, 8, "server", MODEL, nodes=Nodes(count=2))


def test_a_trainjob_node_on_one_gpu_each_still_launches(monkeypatch):
    """Before: `torchrun -m grail.cli train` set LOCAL_RANK, so the node trained in-process
    with DDP and no DeepSpeed. A node now plans even for one process per node."""
    from types import SimpleNamespace

    for name in ("LOCAL_RANK", LAUNCHED, "DS_ACCELERATOR"):
        monkeypatch.delenv(name, raising=False)
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("grail.train.multigpu.visible_gpus", lambda: 1)
    config = SimpleNamespace(
        num_processes=0, vllm_mode="colocate", use_vllm=True, bf16=True, fp16=False
    )
    (trainer,) = plan_for(ARGV, config, SimpleNamespace(model_name_or_path=MODEL))
    assert str(ZERO3) in trainer.command and "--num_machines" in trainer.command
