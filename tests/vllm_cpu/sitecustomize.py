"""Loaded by the vLLM tier's server processes (PYTHONPATH=tests/vllm_cpu): one fix for vLLM's
CPU build, so that `vllm serve` and `trl vllm-serve` (which runs `python -m
vllm.entrypoints.cli.main serve`) start as they do on a GPU.

vllm-cpu 0.31.0 installs the `vllm` command, but its parser reads its own version with
``importlib.metadata.version("vllm")`` (vllm/entrypoints/cli/main.py) while the distribution is
named ``vllm-cpu``: every `vllm ...` exits with PackageNotFoundError before parsing. This answers
that lookup as vLLM's own platform detection does when it falls back to ``vllm-cpu``
(vllm/platforms/__init__.py, vllm_version_matches_substr: vllm-cpu's version plus ``+cpu``).
The CUDA image's vLLM (distribution ``vllm``) needs nothing of the kind.
"""

import importlib.metadata

_real_version = importlib.metadata.version


def _version(name: str) -> str:
    try:
        return _real_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _real_version("vllm-cpu") + "+cpu"


importlib.metadata.version = _version


# TRL's colocate weight sync (the vLLM tier, tests/test_vllm.py): on CPU, vLLM repacks
# every linear weight after loading (oneDNN) and leaves an empty parameter without its
# weight_loader, so `model.load_weights` cannot reach the engine. With
# GRAIL_TEST_VLLM_LIVE_WEIGHTS=1, vLLM's plain F.linear fallback is chosen instead
# (vllm/model_executor/layers/utils.py, dispatch_cpu_unquantized_gemm): the weights stay live.
# A test-only switch of a private name; GPUs have no such repacking.
import os  # noqa: E402

if os.environ.get("GRAIL_TEST_VLLM_LIVE_WEIGHTS") == "1":
    import vllm._custom_ops

    vllm._custom_ops._supports_onednn = False
