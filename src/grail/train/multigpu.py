"""Several training processes: the training entry point relaunches itself under accelerate.

``grail.train.stage.train`` (the CLI's ``grail train``, the KFP train task and a TrainJob's node
command alike) asks :func:`plan_for` what to start. With several GPUs (one process per visible
GPU, or ``num_processes``) it is ``accelerate launch`` with DeepSpeed ZeRO-3
(``grail/train/accelerate/zero3.yaml``: parameters, gradients and optimizer states sharded,
fp32 master weights):

- ``vllm_mode: colocate`` (default): every GPU trains, and each process generates with its own
  vLLM engine on the same GPU;
- ``vllm_mode: server``: the last GPU runs vLLM's server for generation and the others train
  (as the upstream launchers did: 1 + 7 on 8 GPUs). Pick it when the model plus its vLLM cache
  does not fit beside training, or generation dominates the step time. One node only.

A Kubeflow Trainer TrainJob node is told its place by the ``PET_*`` variables Trainer's torch
plugin sets (:class:`Nodes`); the same ZeRO-3 plan then spans the nodes (``--num_machines``,
``--machine_rank``, the master's address).

One GPU trains in this process, with fp32 master weights (:func:`master_dtype`). On a CPU
machine ``num_processes`` > 1 runs data-parallel over gloo without DeepSpeed, unless
``DS_ACCELERATOR=cpu`` asks for DeepSpeed's CPU accelerator: then the GPU plan itself runs on
CPU processes (the rehearsal tier, docs/cluster/gpu.md).

:func:`launch_plan` is pure (unit-tested for 1, 2 and 8 GPUs, several nodes and CPU);
:func:`relaunch` runs the plan.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from grail.core.errors import GrailError

LAUNCHED = "GRAIL_LAUNCHED"  # set in the children, so they train instead of relaunching
ZERO3 = Path(__file__).parent / "accelerate" / "zero3.yaml"
SERVER_START_SECONDS = 600  # a vLLM server loads and compiles before /health answers


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
    health: str | None = None  # a server's URL that answers 200 once it is ready


@dataclass(frozen=True)
class Nodes:
    """This node's place in a multi-node job (one node by default)."""

    count: int = 1
    rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    processes: str = "auto"  # per node: a number, or auto (one per GPU)

    @classmethod
    def from_environment(cls, env=os.environ) -> Nodes:
        """What Kubeflow Trainer's torch plugin sets on every TrainJob node: ``PET_NNODES``,
        ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NPROC_PER_NODE``.

        >>> Nodes.from_environment({"PET_NNODES": "2", "PET_NODE_RANK": "1"}).rank
        1
        >>> Nodes.from_environment({}).count
        1
        """
        if "PET_NNODES" not in env:
            return cls()
        return cls(
            count=int(env["PET_NNODES"]),
            rank=int(env.get("PET_NODE_RANK", "0")),
            master_addr=env.get("PET_MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("PET_MASTER_PORT", "29500")),
            processes=env.get("PET_NPROC_PER_NODE", "auto"),
        )

    def arguments(self, per_node: int) -> list[str]:
        """accelerate's arguments for `per_node` processes on each of these nodes."""
        args = ["--num_processes", str(per_node * self.count)]
        if self.count > 1:
            args += ["--num_machines", str(self.count), "--machine_rank", str(self.rank)]
            args += ["--main_process_ip", self.master_addr]
            args += ["--main_process_port", str(self.master_port)]
        return args


def mixed_precision(config) -> str:
    """accelerate's mixed precision for the recipe's ``bf16`` / ``fp16`` (DeepSpeed refuses a
    config that disagrees with the Trainer's arguments)."""
    return "bf16" if config.bf16 else "fp16" if config.fp16 else "no"


def server_process(model: str, gpu: int, port: int) -> Process:
    """vLLM's server as TRL's trainers expect it (TRL's own ``build_command``: NCCL weight
    transfer, processed logprobs), on one GPU. ``trl vllm-serve`` only execs this command
    and is deprecated in TRL 1.16 (docs/cluster/gpu.md)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    command = build_command(ScriptArguments(model=model, host="127.0.0.1", port=port))
    env = {"CUDA_VISIBLE_DEVICES": str(gpu), "VLLM_SERVER_DEV_MODE": "1"}
    return Process(command, env, health=f"http://127.0.0.1:{port}/health")


def check_server_mode(use_vllm: bool, vllm_mode: str, nodes: int) -> None:
    """Server mode on one node only: TRL's trainers reach one vLLM server, from rank 0."""
    if use_vllm and vllm_mode == "server" and nodes > 1:
        raise GrailError(
            f"vllm_mode server on {nodes} nodes: TRL reaches one server from rank 0 only, "
            "so use vllm_mode colocate across nodes (or one node)"
        )


def launch_plan(
    argv: list[str],
    num_processes: int,
    vllm_mode: str,
    model: str,
    use_vllm: bool = True,
    port: int = 8000,
    deepspeed: bool = True,
    precision: str = "bf16",
    nodes: Nodes = Nodes(),
) -> list[Process]:
    """The processes to start on this node; empty when this process should just train.

    `num_processes` is per node (with DeepSpeed: the GPUs used). `deepspeed` is false on a CPU
    machine without DeepSpeed's CPU accelerator: the processes then run DDP over gloo.

    >>> plan = launch_plan(["--config", "r.yaml"], 2, "colocate", "m")
    >>> Path(plan[0].command[0]).name, plan[0].command[1], plan[0].env["CUDA_VISIBLE_DEVICES"]
    ('accelerate', 'launch', '0,1')
    >>> launch_plan(["--config", "r.yaml"], 2, "colocate", "m", deepspeed=False)[0].command[2:5]
    ['--multi_gpu', '--num_processes', '2']
    """
    if num_processes <= 1 and nodes.count == 1:
        return []
    check_server_mode(use_vllm, vllm_mode, nodes.count)
    server_mode = use_vllm and vllm_mode == "server"
    if not deepspeed:  # gloo: accelerate's multi-process launcher, no DeepSpeed, no vLLM server
        command = [tool("accelerate"), "launch", "--multi_gpu", *nodes.arguments(num_processes)]
        command += ["--mixed_precision", "no", "--dynamo_backend", "no"]
        return [Process([*command, "-m", "grail.cli", "train", *argv], {LAUNCHED: "1"})]
    train_gpus = list(range(num_processes - 1 if server_mode else num_processes))
    plan = []
    if server_mode:
        plan.append(server_process(model, num_processes - 1, port))
        argv = [*argv, "--vllm_server_host", "127.0.0.1", "--vllm_server_port", str(port)]
    command = [tool("accelerate"), "launch", "--config_file", str(ZERO3)]
    command += [*nodes.arguments(len(train_gpus)), "--mixed_precision", precision]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, train_gpus)), LAUNCHED: "1"}
    plan.append(Process([*command, "-m", "grail.cli", "train", *argv], env))
    return plan


def visible_gpus() -> int:
    """CUDA devices, counted through NVML: the launcher itself must not hold a CUDA context
    on GPU 0 while its children train there."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def wait_until_healthy(url: str, server: subprocess.Popen, seconds: float) -> None:
    """Block until `url` answers 200; a server that exits or never answers is a GrailError."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise GrailError(f"the vLLM server exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise GrailError(f"the vLLM server did not answer {url} within {seconds:.0f} s")


def relaunch(plan: list[Process], server_seconds: float = SERVER_START_SECONDS) -> int:
    """Run the plan: the server (if any) in the background until it is healthy, then training
    in the foreground; returns training's exit status (the server's shutdown cannot mask it)."""
    server = None
    try:
        for process in plan[:-1]:
            server = subprocess.Popen(process.command, env=os.environ | process.env)
            if process.health:
                wait_until_healthy(process.health, server, server_seconds)
        trainer = plan[-1]
        return subprocess.run(trainer.command, env=os.environ | trainer.env).returncode
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def launched() -> bool:
    """True in a process accelerate started (ours, or the user's own ``accelerate launch``)."""
    return bool(os.environ.get(LAUNCHED) or os.environ.get("LOCAL_RANK"))


def deepspeed_on_cpu() -> bool:
    """Whether this is a DeepSpeed process that accelerate started on DeepSpeed's CPU
    accelerator (``DS_ACCELERATOR=cpu``): the rehearsal of the GPU path on a CPU machine."""
    return (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
        and os.environ.get("DS_ACCELERATOR") == "cpu"
        and "LOCAL_RANK" in os.environ
    )


def use_gloo_for_deepspeed(config) -> None:
    """Give DeepSpeed on CPU the gloo process group that accelerate cannot pick for it.

    accelerate chooses a backend only for the devices it knows (NCCL for CUDA; gloo only with
    ``cpu=True``, which turns DeepSpeed off). DeepSpeed on CPU therefore comes up with no
    backend, a world size of 1 in the Trainer and DeepSpeed's batch-size check failing. Set up
    accelerate's state with gloo first and let the Trainer use it (``use_configured_state``);
    on GPUs none of this runs and accelerate picks NCCL itself.
    """
    from accelerate import PartialState

    PartialState(backend="gloo")
    accelerator = config.accelerator_config
    if accelerator is not None and not isinstance(accelerator, dict):
        raise GrailError("accelerator_config: DeepSpeed on CPU needs it as a mapping, or unset")
    config.accelerator_config = {**(accelerator or {}), **configured_state()}


def configured_state() -> dict | None:
    """The ``accelerator_config`` of a further ``TrainingArguments`` in this process (the SFT
    warm start's): keep DeepSpeed-on-CPU's gloo state, else let transformers set up its own."""
    return {"use_configured_state": True} if deepspeed_on_cpu() else None


def uses_deepspeed() -> bool:
    """Whether the plan on this machine is the DeepSpeed one: GPUs, or DeepSpeed's CPU
    accelerator asked for (``DS_ACCELERATOR=cpu``)."""
    return visible_gpus() > 0 or os.environ.get("DS_ACCELERATOR") == "cpu"


def plan_for(argv: list[str], config, model_config) -> list[Process]:
    """The launch plan for this node: ``num_processes`` when set, else the node's
    ``PET_NPROC_PER_NODE``, else one per GPU."""
    if launched():
        return []
    nodes = Nodes.from_environment()
    processes = config.num_processes
    if not processes and nodes.processes.isascii() and nodes.processes.isdigit():
        processes = int(nodes.processes)
    processes = processes or visible_gpus()
    if nodes.count > 1:
        processes = max(processes, 1)
    return launch_plan(
        argv,
        processes,
        config.vllm_mode,
        model_config.model_name_or_path,
        use_vllm=config.use_vllm,
        deepspeed=uses_deepspeed(),
        precision=mixed_precision(config),
        nodes=nodes,
    )


def deepspeed_active(config) -> bool:
    """Whether this training process runs under DeepSpeed (accelerate's launcher, or a
    ``deepspeed`` config in the recipe)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" or bool(
        config.deepspeed
    )


def master_dtype(dtype: str | None, deepspeed: bool, peft: bool) -> str | None:
    """The dtype the trained weights are loaded in.

    Under DeepSpeed the recipe's ``dtype`` stands: DeepSpeed keeps fp32 master weights beside
    the bf16 ones. In a single process the Trainer updates the loaded weights themselves, and
    an Adam step of about ``lr`` rounds away in bf16 (adding 1e-6 to bf16 weights of scale
    0.02 changes 2% of them, LayerNorm weights at 1.0 none): load them in fp32 and let
    ``bf16: true`` run the forward and backward passes in bf16 (autocast). LoRA adapters are
    fp32 already (PEFT's default), so a LoRA run keeps its half-precision base.

    >>> master_dtype("bfloat16", False, False), master_dtype("bfloat16", True, False)
    ('float32', 'bfloat16')
    >>> master_dtype("bfloat16", False, True), master_dtype("float32", False, False)
    ('bfloat16', 'float32')
    """
    if dtype in ("bfloat16", "float16") and not deepspeed and not peft:
        return "float32"
    return dtype
