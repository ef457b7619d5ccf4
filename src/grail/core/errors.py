"""Errors a user can act on: each names the file and, where it applies, the row and the field.

The CLI prints them as one line and exits non-zero (a traceback only with ``--debug``).
"""

from __future__ import annotations

import atexit
import errno
import functools
import gc
import inspect
import json
import re
import sys
from pathlib import Path


class GrailError(Exception):
    """An error caused by input or configuration, reported without a traceback; the CLI exits
    with `exit_code` (2: the input is wrong)."""

    exit_code = 2


class ProcessesFailed(GrailError):
    """Processes this one started failed (they printed why): exit with their status, not the
    input error's 2 (a training crash is not bad input).

    >>> ProcessesFailed("training processes", 1).exit_code
    1
    """

    def __init__(self, what: str, status: int):
        super().__init__(f"{what} exited with status {status}")
        self.exit_code = status if 0 < status < 256 else 1


class DataError(GrailError):
    """Bad input data.

    >>> str(DataError("bad value", file="raw/sessions.json", row="session 3", field="vids"))
    'raw/sessions.json: session 3, field vids: bad value'
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        row: str | int | None = None,
        field: str | None = None,
    ):
        self.file, self.row, self.field = file, row, field
        where = [str(file)] if file is not None else []
        detail = []
        if row is not None:
            detail.append(f"row {row}" if isinstance(row, int) else str(row))
        if field is not None:
            detail.append(f"field {field}")
        prefix = ": ".join(where + ([", ".join(detail)] if detail else []))
        super().__init__(f"{prefix}: {message}" if prefix else message)


def mask_secrets(text: str) -> str:
    """Hide credentials in a message: passwords in URLs, bearer tokens, session cookies.

    >>> mask_secrets("http://ann:s3cret@mlflow:5000 and Bearer abc.def")
    'http://ann:***@mlflow:5000 and Bearer ***'
    >>> mask_secrets("Cookie: authservice_session=xyz; other=1")
    'Cookie: authservice_session=***; other=1'
    """
    text = re.sub(r"(\w+://[^/\s:@]+):[^@\s/]+@", r"\1:***@", text)
    text = re.sub(r"(?i)(bearer\s+)[^\s,;'\"]+", r"\1***", text)
    return re.sub(r"(?i)(session[\w-]*=)[^;\s'\"]+", r"\1***", text)


# Errors that mean the input is wrong (a value, a path the user gave): exit 2, no traceback.
INPUT_ERRORS = (
    GrailError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,  # an --out or a file the process may not write or read
    RecursionError,  # a JSON file nested deeper than the parser goes (a hand-made marker)
)
# OS errors of a path the user gave: too long a name, a loop of links, a name the file system
# cannot encode
INPUT_ERRNOS = (errno.ENAMETOOLONG, errno.ELOOP, errno.EILSEQ, errno.ENOSPC, errno.EDQUOT)
# a full disk as libraries report it from their own writers: torch.save's zip writer,
# safetensors' Rust one
DISK_FULL = ("No space left on device", "StorageFull", "file write failed")


def disk_full(error: BaseException) -> bool:
    """Whether `error` is a write that failed for a full disk, as torch or safetensors say it.

    >>> disk_full(RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos "
    ...     "64 vs 0; PytorchStreamWriter failed writing file data/0: file write failed"))
    True
    """
    return not isinstance(error, OSError) and any(text in str(error) for text in DISK_FULL)


def is_input_error(error: BaseException) -> bool:
    """Whether `error` means the input is wrong (exit 2, one line): :data:`INPUT_ERRORS`, an
    OS error of a path the user gave (:data:`INPUT_ERRNOS`), a loop of links, a file name
    that is not UTF-8."""
    return (
        isinstance(error, INPUT_ERRORS)
        or (isinstance(error, OSError) and error.errno in INPUT_ERRNOS)
        or (isinstance(error, RuntimeError) and str(error).startswith("Symlink loop"))
        or (isinstance(error, UnicodeEncodeError) and error.reason == "surrogates not allowed")
        or disk_full(error)
    )


def describe(error: BaseException) -> tuple[str, str]:
    """("input" or "bug", one line) for an error: an input error is its message (a missing
    path named first), anything else a bug named by its type.

    >>> describe(FileNotFoundError(2, "No such file or directory", "raw/x.json"))
    ('input', 'raw/x.json: No such file or directory')
    >>> describe(ZeroDivisionError("division by zero"))
    ('bug', 'ZeroDivisionError: division by zero')
    >>> describe(OSError(28, "No space left on device", "out/train.parquet"))
    ('input', 'out/train.parquet: No space left on device')
    """
    if isinstance(error, GrailError):
        text = str(error)
    elif isinstance(error, OSError) and error.errno in INPUT_ERRNOS:
        where = f"{error.filename}: " if error.filename else ""
        text = where + (error.strerror or str(error))
    elif isinstance(error, RuntimeError) and str(error).startswith("Symlink loop"):
        text = f"{str(error).removeprefix('Symlink loop from ')}: a loop of symbolic links"
    elif isinstance(error, UnicodeEncodeError) and error.reason == "surrogates not allowed":
        text = "a file name that is not UTF-8: rename it"
    elif isinstance(error, RecursionError):
        text = "a file nested deeper than grail reads (a JSON file made by hand?)"
    elif disk_full(error):
        first = (str(error).strip().splitlines() or [""])[0]
        text = f"no space left on the disk being written: free some and run again ({first})"
    elif isinstance(error, INPUT_ERRORS):
        where = f"{error.filename}: " if error.filename else ""
        text = where + (error.strerror or str(error))
    else:
        first = (str(error).strip().splitlines() or [""])[0]
        return "bug", mask_secrets(f"{type(error).__name__}: {first}".rstrip(": "))
    return "input", mask_secrets(text)


# A pipeline task that fails prints one marker line before the executor's traceback, so a
# runner (``grail run --local``) can show the task's own error instead of the log.
TASK_FAILURE = "GRAIL_TASK_FAILURE"


def report_task_failure(task: str, error: BaseException, **where: str) -> None:
    """The marker line for `task` failing with `error` (`where`: its issue, algorithm)."""
    kind, message = describe(error)
    message = " ".join(message.split())  # one line
    record = {"task": task, **{k: v for k, v in where.items() if v}, "kind": kind}
    sys.stderr.write(f"{TASK_FAILURE} {json.dumps(record | {'message': message})}\n")
    sys.stderr.flush()


def task_failures(log: str) -> list[dict]:
    """The marker lines in a log, in order (a runner may indent them).

    >>> task_failures('  GRAIL_TASK_FAILURE {"task": "clean", "kind": "input", "message": "m"}')
    [{'task': 'clean', 'kind': 'input', 'message': 'm'}]
    """
    found = []
    for match in re.finditer(rf"{TASK_FAILURE} (\{{.*\}})\s*$", log, flags=re.MULTILINE):
        try:
            found.append(json.loads(match.group(1)))
        except json.JSONDecodeError:
            continue
    return found


def reported(task: str):
    """A task body that, when it fails, first prints the one line a runner shows
    (:func:`grail.core.errors.report_task_failure`: `task`, its issue and algorithm, the error),
    then fails as before (the traceback stays in the task's log)."""

    def wrap(body):
        signature = inspect.signature(body)

        @functools.wraps(body)
        def run(*args, **kwargs):
            exit_without_final_collections()
            try:
                return body(*args, **kwargs)
            except Exception as error:
                given = signature.bind_partial(*args, **kwargs).arguments
                where = {k: str(given.get(k) or "") for k in ("issue", "algorithm")}
                report_task_failure(task, error, **where)
                raise

        return run

    return wrap


def exit_without_final_collections() -> None:
    """At this process's exit, :func:`gc.freeze` what is left, so that the interpreter's
    shutdown skips its collector passes over everything torch, transformers and MLflow imported
    (measured: docs/development.md#the-demo; exit handlers still run, the exit status is
    unchanged). A task is a process of its own (kfp.local, a pod); registered once."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


class NonFiniteTraining(GrailError):
    """Training produced a NaN or infinite loss, gradient or weight: stopped, nothing saved
    (exit 1: every value was in range; the run itself diverged)."""

    exit_code = 1


class OutOfRange(GrailError):
    """A configuration value outside what the field allows; `field` names it so that the parser
    can say where the value came from (the recipe, the environment or the command line)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
