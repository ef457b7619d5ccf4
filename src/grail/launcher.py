"""Multi-GPU training in one pod: ``grail train`` relaunches itself under accelerate.

With more than one GPU visible, ``grail train`` builds and runs an ``accelerate launch`` command
with DeepSpeed ZeRO-3 (``grail/accelerate/zero3.yaml``) over the pod's GPUs:

- ``vllm_mode: colocate`` (default): every GPU trains, and each process generates with its own
  vLLM engine on the same GPU;
- ``vllm_mode: server``: the last GPU runs ``trl vllm-serve`` for generation and the others train
  (as the upstream launchers did: 1 + 7 on 8 GPUs). Pick it when the model plus its vLLM cache
  does not fit beside training, or generation dominates the step time.

:func:`launch_plan` is pure (unit-tested for 1, 2 and 8 GPUs); :func:`relaunch` runs the plan.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHED = "GRAIL_LAUNCHED"  # set in the children, so they train instead of relaunching
ZERO3 = Path(__file__).parent / "accelerate" / "zero3.yaml"


@dataclass
class Process:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


def launch_plan(
    argv: list[str],
    num_gpus: int,
    vllm_mode: str,
    model: str,
    use_vllm: bool = True,
    port: int = 8000,
) -> list[Process]:
    """The processes to start for `num_gpus` GPUs; empty when this process should just train.

    One GPU (or none) trains in this process; in server mode with one GPU the vLLM server is
    expected elsewhere (``vllm_server_host``).

    >>> plan = launch_plan(["--config", "r.yaml"], 2, "colocate", "m")
    >>> plan[0].command[:2], plan[0].env["CUDA_VISIBLE_DEVICES"]
    (['accelerate', 'launch'], '0,1')
    """
    if num_gpus <= 1:
        return []
    server_mode = use_vllm and vllm_mode == "server"
    train_gpus = list(range(num_gpus - 1 if server_mode else num_gpus))
    plan = []
    if server_mode:
        plan.append(
            Process(
                [
                    "trl",
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
                {"CUDA_VISIBLE_DEVICES": str(num_gpus - 1)},
            )
        )
        argv = [*argv, "--vllm_server_host", "127.0.0.1", "--vllm_server_port", str(port)]
    plan.append(
        Process(
            [
                "accelerate",
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


def maybe_relaunch(argv: list[str], config, model_config) -> None:
    """From ``grail train``: relaunch under accelerate when several GPUs are visible."""
    if os.environ.get(LAUNCHED) or os.environ.get("LOCAL_RANK"):
        return  # already a launched child (ours, or the user's own `accelerate launch`)
    plan = launch_plan(
        argv,
        visible_gpus(),
        config.vllm_mode,
        model_config.model_name_or_path,
        use_vllm=config.use_vllm,
    )
    if plan:
        sys.exit(relaunch(plan))
