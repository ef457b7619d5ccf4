"""The container images: the one place the pipeline compile reads them from.

``IMAGE`` runs every CPU stage (clean, generate client, benchmark, export); ``TRAIN_IMAGE`` (CUDA,
torch, TRL, vLLM) runs training. Both are also pipeline parameters, so a run can use others.
"""

REGISTRY = "ghcr.io/grail-pipeline"
VERSION = "0.1.0"
IMAGE = f"{REGISTRY}/grail:{VERSION}"
TRAIN_IMAGE = f"{REGISTRY}/grail-train:{VERSION}"
