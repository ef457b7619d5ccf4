"""Errors a user can act on: each names the file and, where it applies, the row and the field.

The CLI prints them as one line and exits non-zero (a traceback only with ``--debug``).
"""

from __future__ import annotations

import re
from pathlib import Path


class GrailError(Exception):
    """An error caused by input or configuration, reported without a traceback."""


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
