"""Multi-GPU launch: the commands `grail train` runs for 1, 2 and 8 GPUs in both vLLM modes."""

from __future__ import annotations

import pytest
import yaml

from grail.train.multigpu import LAUNCHED, ZERO3, launch_plan, tool

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
        "-m",
        "grail.cli",
        "train",
        *ARGV,
    ]
    assert trainer.env == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(gpus))), LAUNCHED: "1"}


@pytest.mark.parametrize(("gpus", "training"), [(2, "0"), (8, "0,1,2,3,4,5,6")])
def test_server_mode_serves_on_the_last_gpu_and_trains_on_the_rest(gpus, training):
    server, trainer = launch_plan(ARGV, gpus, "server", MODEL, port=8123)
    assert server.command == [
        tool("trl"),
        "vllm-serve",
        "--model",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "1",
    ]
    assert server.env == {"CUDA_VISIBLE_DEVICES": str(gpus - 1)}
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
