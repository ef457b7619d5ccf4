"""The container images: the one place the pipeline compile reads them from.

``IMAGE`` is every component's default image: clean, generate (a client of a model server),
compare, export and the tracking tasks run in it. ``TRAIN_IMAGE`` (CUDA, torch, TRL, vLLM) runs
training and the benchmark of its checkpoints (the DAG sets it on those tasks, on the training
pool). Both are also pipeline parameters (``image``, ``train_image``), so a run can use others.
"""

REGISTRY = "ghcr.io/grail-pipeline"
VERSION = "0.1.0"
IMAGE = f"{REGISTRY}/grail:{VERSION}"
TRAIN_IMAGE = f"{REGISTRY}/grail-train:{VERSION}"
