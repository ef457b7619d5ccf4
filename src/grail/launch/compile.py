"""``grail compile [--task TASK] [--out FILE]``: the DAGs' PipelineSpec IR (with
kfp-kubernetes' PlatformSpec), committed and drift-checked by a test: each task's DAG, built from
its registry entry (``pipelines/grail.yaml``: the slate task; ``pipelines/summarize.yaml``: the
summarize task)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from grail.core.config import option
from grail.core.errors import GrailError
from grail.tasks import TASKS, Task


def compiled_pipeline(task: str = "slate") -> Path:
    """A task's compiled DAG beside the DAGs' source (package ``grail.pipelines``): its
    ``dag.file``, ``pipelines/grail.yaml`` for the slate task."""
    return Path(str(files("grail.pipelines").joinpath(TASKS[task].dag.file)))


def task_pipeline(task: str):
    """`task`'s DAG, built from its registry entry (:func:`grail.pipelines.dag.pipeline`)."""
    from grail.pipelines.dag import pipeline

    return pipeline(task)


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


def compile_pipeline(out: str | Path | None = None, task: str = "slate") -> Path:
    """Compile `task`'s DAG to `out` (default: beside its source): compiled into a temporary
    file, then renamed over `out` only when `out` is absent or a compiled DAG itself (kfp's
    header first); anything else, a link, or a place inside an export is refused in one line
    before kfp writes a byte (kfp opens `out` for writing first: a user's file was emptied)."""
    import os
    import tempfile

    from kfp import compiler

    from grail.core.outputs import check_own_file

    out = Path(out) if out else compiled_pipeline(task)
    if out.suffix not in (".yaml", ".yml", ".json"):
        raise GrailError(f"{out}: a compiled DAG is a .yaml or .json file")
    check_own_file(out, "compile", is_compiled)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as folder:
        staged = Path(folder) / out.name
        compiler.Compiler().compile(task_pipeline(task), str(staged))
        staged.write_text(stable_header(staged.read_text()))
        os.replace(staged, out)
    return out


KFP_HEADER = b"# PIPELINE DEFINITION"  # the first line kfp's compiler writes to a .yaml


def is_compiled(path: Path) -> bool:
    """Whether `path` is a DAG kfp compiled: its YAML header, or JSON with a pipelineInfo."""
    import json

    with path.open("rb") as handle:
        head = handle.read(len(KFP_HEADER))
    if head == KFP_HEADER:
        return True
    if path.suffix != ".json" or path.stat().st_size > 50 << 20:
        return False
    try:
        spec = json.loads(path.read_bytes())
    except ValueError:
        return False
    return isinstance(spec, dict) and isinstance(spec.get("pipelineInfo"), dict)


@dataclass(kw_only=True)
class CompileConfig:
    """grail compile: the pipelines' IR (with kfp-kubernetes' PlatformSpec)."""

    task: Task | None = option(
        "Compile one task's DAG (slate: pipelines/grail.yaml, summarize: "
        "pipelines/summarize.yaml); default every task grail ships.",
        None,
    )
    out: str | None = option(
        "Output path of the one task's DAG (default: beside its source).", None
    )
