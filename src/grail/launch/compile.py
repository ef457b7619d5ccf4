"""``grail compile [--task slate|summarize] [--out FILE]``: the DAGs' PipelineSpec IR (with
kfp-kubernetes' PlatformSpec), committed and drift-checked by a test: ``pipelines/grail.yaml``
(the slate task) and ``pipelines/summarize.yaml`` (the summarize task)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from grail.core.config import option
from grail.pipelines.pipeline import grail_pipeline
from grail.pipelines.summarize import summarize_pipeline
from grail.tasks import Task

# Each task's DAG and the file it compiles to, beside its source.
PIPELINES = {
    "slate": (grail_pipeline, "grail.yaml"),
    "summarize": (summarize_pipeline, "summarize.yaml"),
}


def compiled_pipeline(task: str = "slate") -> Path:
    """A task's compiled DAG beside its source: ``pipelines/grail.yaml`` or
    ``pipelines/summarize.yaml`` (package ``grail.pipelines``)."""
    return Path(str(files("grail.pipelines").joinpath(PIPELINES[task][1])))


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
    """Compile `task`'s DAG to `out` (default: beside its source)."""
    from kfp import compiler

    out = Path(out) if out else compiled_pipeline(task)
    compiler.Compiler().compile(PIPELINES[task][0], str(out))
    out.write_text(stable_header(out.read_text()))
    return out


@dataclass(kw_only=True)
class CompileConfig:
    """grail compile: the pipelines' IR (with kfp-kubernetes' PlatformSpec)."""

    task: Task | None = option(
        "Compile one task's DAG (slate: pipelines/grail.yaml, summarize: "
        "pipelines/summarize.yaml); default both.",
        None,
    )
    out: str | None = option(
        "Output path of the one task's DAG (default: beside its source).", None
    )
