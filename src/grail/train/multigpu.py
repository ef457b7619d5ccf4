"""Several training processes in one pod: the training entry point relaunches under accelerate.

``grail.train.grpo.train`` (the CLI's ``grail train`` and the KFP train task alike) starts one
process per visible GPU, or ``num_processes`` when the recipe or command line sets it, with
``accelerate launch``. On GPUs it uses DeepSpeed ZeRO-3 (``grail/train/accelerate/zero3.yaml``):

- ``vllm_mode: colocate`` (default): every GPU trains, and each process generates with its own
  vLLM engine on the same GPU;
- ``vllm_mode: server``: the last GPU runs ``trl vllm-serve`` for generation and the others train
  (as the upstream launchers did: 1 + 7 on 8 GPUs). Pick it when the model plus its vLLM cache
  does not fit beside training, or generation dominates the step time.

Without GPUs (``num_processes`` > 1 on a CPU machine) the processes run data-parallel over
torch.distributed's gloo backend, without DeepSpeed: the same code paths (gathers, per-rank
discriminator replicas) as on a GPU pool, testable on a laptop.

:func:`launch_plan` is pure (unit-tested for 1, 2 and 8 GPUs and for CPU); :func:`relaunch` runs
the plan.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHED = "GRAIL_LAUNCHED"  # set in the children, so they train instead of relaunching
ZERO3 = Path(__file__).parent / "accelerate" / "zero3.yaml"


def tool(name: str) -> str:
    """A console script of this environment (beside its Python), else found on PATH.

    >>> Path(tool("accelerate")).name
    'accelerate'
    """
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else name


@dataclass
class Process:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


def launch_plan(
    argv: list[str],
    num_processes: int,
    vllm_mode: str,
    model: str,
    use_vllm: bool = True,
    port: int = 8000,
    gpus: bool = True,
) -> list[Process]:
    """The processes to start; empty when this process should just train.

    With GPUs, `num_processes` is the number of GPUs used. One process trains in this process;
    in server mode with one GPU the vLLM server is expected elsewhere (``vllm_server_host``).

    >>> plan = launch_plan(["--config", "r.yaml"], 2, "colocate", "m")
    >>> Path(plan[0].command[0]).name, plan[0].command[1], plan[0].env["CUDA_VISIBLE_DEVICES"]
    ('accelerate', 'launch', '0,1')
    >>> launch_plan(["--config", "r.yaml"], 2, "colocate", "m", gpus=False)[0].command[2:5]
    ['--multi_gpu', '--num_processes', '2']
    """
    if num_processes <= 1:
        return []
    if not gpus:  # gloo: accelerate's multi-process launcher, no DeepSpeed, no vLLM server
        command = [
            tool("accelerate"),
            "launch",
            "--multi_gpu",
            "--num_processes",
            str(num_processes),
        ]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        return [Process([*command, "-m", "grail.cli", "train", *argv], {LAUNCHED: "1"})]
    server_mode = use_vllm and vllm_mode == "server"
    train_gpus = list(range(num_processes - 1 if server_mode else num_processes))
    plan = []
    if server_mode:
        plan.append(
            Process(
                [
                    tool("trl"),
                    "vllm-serve",
                    "--model",
                    model,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--tensor-parallel-size",
                    "1",
                ],
                {"CUDA_VISIBLE_DEVICES": str(num_processes - 1)},
            )
        )
        argv = [*argv, "--vllm_server_host", "127.0.0.1", "--vllm_server_port", str(port)]
    plan.append(
        Process(
            [
                tool("accelerate"),
                "launch",
                "--config_file",
                str(ZERO3),
                "--num_processes",
                str(len(train_gpus)),
                "-m",
                "grail.cli",
                "train",
                *argv,
            ],
            {"CUDA_VISIBLE_DEVICES": ",".join(map(str, train_gpus)), LAUNCHED: "1"},
        )
    )
    return plan


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def relaunch(plan: list[Process]) -> int:
    """Run the plan: the vLLM server (if any) in the background, training in the foreground."""
    server = None
    try:
        for process in plan[:-1]:
            server = subprocess.Popen(process.command, env=os.environ | process.env)
        trainer = plan[-1]
        return subprocess.run(trainer.command, env=os.environ | trainer.env).returncode
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)


def launched() -> bool:
    """True in a process accelerate started (ours, or the user's own ``accelerate launch``)."""
    return bool(os.environ.get(LAUNCHED) or os.environ.get("LOCAL_RANK"))


def plan_for(argv: list[str], config, model_config) -> list[Process]:
    """The launch plan for this machine: ``num_processes`` when set, else one per GPU."""
    if launched():
        return []
    gpus = visible_gpus()
    processes = config.num_processes or gpus
    return launch_plan(
        argv,
        processes,
        config.vllm_mode,
        model_config.model_name_or_path,
        use_vllm=config.use_vllm,
        gpus=gpus > 0,
    )
