"""Compile the DAG, run it locally with ``kfp.local``, or submit it to a Kubeflow cluster.

- ``grail compile [--out pipelines/grail.yaml]``: the PipelineSpec IR (with kfp-kubernetes'
  PlatformSpec), committed and drift-checked by a test.
- ``grail run --local [--recipe R] [--participants N]``: the whole DAG on this machine with
  ``kfp.local.SubprocessRunner(use_venv=False)``: synthetic study, tiny offline models, MLflow
  in a local sqlite store (or ``MLFLOW_TRACKING_URI``), export to a local folder unless an S3
  destination is given. No network, GPU or Kubernetes.
- ``grail submit [pipelines/grail.yaml] --host URL --experiment NAME [--param k=v ...]``: a run
  through ``kfp.Client``.

These need the repository checkout (``pipelines/`` and ``components/``): run them from its root,
or set ``GRAIL_HOME``.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import sys
import time
from pathlib import Path

from grail.errors import GrailError


def repo_root() -> Path:
    for root in (Path.cwd(), Path(os.environ.get("GRAIL_HOME", "/opt/grail"))):
        if (root / "pipelines" / "grail.py").is_file():
            return root.resolve()
    raise GrailError("pipelines/grail.py not found: run from the repository root or set GRAIL_HOME")


def load_pipeline():
    """The pipeline function from ``pipelines/grail.py``."""
    root = str(repo_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module("pipelines.grail").grail_pipeline


def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def stable_header(text: str) -> str:
    r"""kfp's header comment prints dict defaults in arbitrary key order; sort them, so the
    committed file only changes when the pipeline does.

    >>> stable_header("#    t: list [Default: [{'b': 1, 'a': 2}]]\nbody")
    "#    t: list [Default: [{'a': 2, 'b': 1}]]\nbody"
    """
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if line.startswith("#") and "[Default: " in line and line.endswith("]"):
            head, _, default = line.partition("[Default: ")
            try:
                value = ast.literal_eval(default[:-1])
            except (ValueError, SyntaxError):
                continue
            lines[k] = f"{head}[Default: {_sorted(value)!r}]"
    return "\n".join(lines)


def compile_pipeline(out: str | Path | None = None) -> Path:
    from kfp import compiler

    out = Path(out) if out else repo_root() / "pipelines" / "grail.yaml"
    compiler.Compiler().compile(load_pipeline(), str(out))
    out.write_text(stable_header(out.read_text()))
    return out


def local_arguments(
    recipe: str,
    participants: int,
    destination: str | None,
    algorithm: str,
    max_steps: int,
    benchmark_limit: int,
) -> dict:
    """Pipeline arguments of the embedded default (tiny models, synthetic study)."""
    return {
        "participants": participants,
        "recipe": recipe,
        "algorithm": algorithm,
        "tiny_model": True,
        "recipe_overrides": json.dumps(
            {"max_steps": max_steps, "save_steps": max(1, max_steps // 2)}
        ),
        "benchmark_limit": benchmark_limit,
        "benchmark_max_new_tokens": 48,
        "checkpoint_uri": "",
        "export_destination": destination,
        "mlflow_experiment": "grail-local",
    }


def run_local(
    recipe: str = "recipes/tiny/config_{algorithm}.yaml",
    participants: int = 1500,
    destination: str | None = None,
    algorithm: str = "grail",
    max_steps: int = 10,
    benchmark_limit: int = 100,
    outputs: str | Path = "local_outputs",
) -> dict:
    """Run the whole DAG with kfp.local; returns where the outputs are."""
    from kfp import local

    outputs = Path(outputs).absolute()
    os.chdir(repo_root())
    outputs.mkdir(parents=True, exist_ok=True)
    destination = destination or str(outputs / "export")
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{outputs / 'mlflow.db'}")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["GRAIL_KFP_LOCAL"] = "1"  # see pipelines/grail.py
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # parallel branches share 2 cores
        os.environ.setdefault(name, "1")
    root = outputs / "pipeline_root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    started = time.time()
    arguments = local_arguments(
        recipe, participants, destination, algorithm, max_steps, benchmark_limit
    )
    load_pipeline()(**arguments)
    return locate_outputs(root, started) | {
        "export": arguments["export_destination"],
        "mlflow": os.environ["MLFLOW_TRACKING_URI"],
        "seconds": round(time.time() - started, 1),
    }


def locate_outputs(root: Path, since: float) -> dict:
    """The newest local run's report, charts and models (kfp.local writes under the root)."""

    def newest(pattern: str) -> list[str]:
        found = [p for p in root.glob(pattern) if p.stat().st_mtime >= since - 1]
        return sorted(str(p) for p in found)

    return {
        "reports": newest("**/benchmark*/results/report.md"),
        "charts": newest("**/benchmark*/results/*.svg"),
        "models": [str(Path(p).parent) for p in newest("**/train*/model/config.json")],
    }


def parse_params(pairs: list[str]) -> dict:
    """``key=value`` pairs; values parsed as JSON when they are (numbers, lists, true/false)."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise GrailError(f"--param {pair!r}: expected key=value")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def submit(
    package: str, host: str, experiment: str, params: list[str], run_name: str | None = None
) -> str:
    """Create a run of the compiled pipeline on a KFP cluster; returns the run id."""
    import kfp

    client = kfp.Client(host=host)
    result = client.create_run_from_pipeline_package(
        package,
        arguments=parse_params(params),
        experiment_name=experiment,
        run_name=run_name or f"grail-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    return result.run_id
