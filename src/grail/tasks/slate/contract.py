"""The cleaned dataset contract: one row per step (current video -> next clicked video).

Every stage after ``clean`` reads data through :func:`read_dataset`, which checks a parquet file
(or a cleaned folder) against :data:`SCHEMA` and names the file, row and column of the first
violation.
Users may bring their own data in this contract; extra columns are kept.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from grail.core.errors import DataError
from grail.core.outputs import check_complete, check_listed
from grail.tasks.slate import policy_issues

ISSUES = tuple(policy_issues.ISSUES)  # ("gun_control", "minimum_wage")
SPLITS = ("train", "validation")
OPINION_DIRECTIONS = ("increase", "decrease", "no_change")

# Profile fields printed in the VIEWER line, plus the issue items used for SURVEY HIGHLIGHTS.
# All are strings so the same contract holds coded (``"3"``) and labelled (``"Democrat"``) surveys.
VIEWER_FIELDS = (
    "age",
    "gender",
    "race",
    "income",
    "pid1",
    "pid2",
    "ideo1",
    "freq_youtube",
    "college",
    "pol_interest",
    "religpew",
    "newsint",
    "gun_own",
    "stricter_laws",
    "assault_ban",
    "handgun_ban",
    "concealed_safe",
    "gun_importance",
    "gun_enthusiasm",
    "minwage15",
    "mw_support",
)

VIDEO = pa.struct([("id", pa.string()), ("title", pa.string()), ("channel", pa.string())])
HISTORY_ITEM = pa.struct(
    [
        ("id", pa.string()),
        ("title", pa.string()),
        ("channel", pa.string()),
        ("watch_seconds", pa.float64()),
        ("total_seconds", pa.float64()),
    ]
)
SLATE_ITEM = pa.struct(
    [
        ("id", pa.string()),
        ("title", pa.string()),
        ("channel", pa.string()),
        ("duration_seconds", pa.int64()),
        ("views", pa.int64()),
        ("likes", pa.int64()),
        ("comments", pa.int64()),
    ]
)
VIEWER = pa.struct([(name, pa.string()) for name in VIEWER_FIELDS])

SCHEMA = pa.schema(
    [
        ("participant_id", pa.string()),
        ("session_id", pa.string()),
        ("study", pa.string()),
        ("issue", pa.string()),
        ("step_index", pa.int64()),
        ("current_video", VIDEO),
        ("history", pa.list_(HISTORY_ITEM)),
        ("slate", pa.list_(SLATE_ITEM)),
        ("gold_index", pa.int64()),
        ("gold_id", pa.string()),
        ("n_options", pa.int64()),
        ("viewer", VIEWER),
        ("opinion_before", pa.float64()),
        ("opinion_after", pa.float64()),
        ("opinion_direction", pa.string()),
        ("split", pa.string()),
    ]
)
REQUIRED_NOT_NULL = (
    "participant_id",
    "session_id",
    "study",
    "issue",
    "step_index",
    "slate",
    "gold_index",
    "gold_id",
    "n_options",
    "split",
)


def _first_bad_row(mask: pa.ChunkedArray) -> int:
    """Index of the first True in a boolean mask (nulls count as False)."""
    return int(pc.index(pc.fill_null(mask, False), True).as_py())


def _is_compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Integers may be any width; struct fields may be a superset; lists compare their items."""
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(actual) or pa.types.is_integer(actual)
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    if pa.types.is_list(expected):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _is_compatible(
            actual.value_type, expected.value_type
        )
    if pa.types.is_struct(expected):
        if not pa.types.is_struct(actual):
            return False
        names = {actual.field(i).name: actual.field(i).type for i in range(actual.num_fields)}
        return all(
            expected.field(i).name not in names
            or _is_compatible(names[expected.field(i).name], expected.field(i).type)
            for i in range(expected.num_fields)
        ) and any(expected.field(i).name in names for i in range(expected.num_fields))
    return actual == expected


def validate_table(table: pa.Table, path: str | Path) -> None:
    """Raise :class:`DataError` naming the file, row and column of the first contract violation."""
    _check_columns(table, path)
    _check_slate_items(table, path)
    for name, bad, rule in _row_rules(table):
        if pc.any(pc.fill_null(bad, False)).as_py():
            row = _first_bad_row(bad)
            raise DataError(
                f"{rule}, got {table[name][row].as_py()!r}", file=path, row=row, field=name
            )
    _check_gold_ids(table, path)


def _check_columns(table: pa.Table, path: str | Path) -> None:
    """Every column present with a compatible type; no nulls where the contract forbids them."""
    for field in SCHEMA:
        if field.name not in table.column_names:
            raise DataError("missing required column", file=path, field=field.name)
        actual = table.schema.field(field.name).type
        if not _is_compatible(actual, field.type):
            raise DataError(
                f"expected type {field.type}, got {actual}", file=path, field=field.name
            )
    for name in REQUIRED_NOT_NULL:
        if table[name].null_count:
            raise DataError(
                "null value", file=path, row=_first_bad_row(pc.is_null(table[name])), field=name
            )


def _check_slate_items(table: pa.Table, path: str | Path) -> None:
    """No null item, every item has an id, no negative count."""
    items = pc.list_flatten(table["slate"])
    per_row = pc.list_parent_indices(table["slate"])
    for bad, rule in (
        (pc.is_null(items), "a slate holds a null item"),
        (pc.is_null(pc.struct_field(items, "id")), "a slate item has no id"),
    ):
        if pc.any(pc.fill_null(bad, True)).as_py():
            row = per_row[_first_bad_row(pc.fill_null(bad, True))].as_py()
            raise DataError(rule, file=path, row=row, field="slate")
    for field in ("views", "likes", "comments", "duration_seconds"):
        negative = pc.less(pc.struct_field(items, field), 0)
        if pc.any(pc.fill_null(negative, False)).as_py():
            raise DataError(
                f"slate {field} must not be negative", file=path, field=f"slate.{field}"
            )


def _row_rules(table: pa.Table) -> list[tuple[str, pa.ChunkedArray, str]]:
    """(column, which rows break the rule, the rule) for the per-row value rules."""
    rules = [
        (
            "issue",
            pc.invert(pc.is_in(table["issue"], pa.array(ISSUES))),
            f"must be one of {ISSUES}",
        ),
        (
            "split",
            pc.invert(pc.is_in(table["split"], pa.array(SPLITS))),
            f"must be one of {SPLITS}",
        ),
        (
            "n_options",
            pc.not_equal(table["n_options"], pc.list_value_length(table["slate"])),
            "must equal the slate's length",
        ),
        (
            "gold_index",
            pc.or_(
                pc.less(table["gold_index"], 1), pc.greater(table["gold_index"], table["n_options"])
            ),
            "must be within 1..n_options",
        ),
        (
            "opinion_direction",
            pc.and_(
                pc.is_valid(table["opinion_direction"]),
                pc.invert(pc.is_in(table["opinion_direction"], pa.array(OPINION_DIRECTIONS))),
            ),
            f"must be one of {OPINION_DIRECTIONS} or null",
        ),
    ]
    for name in ("opinion_before", "opinion_after"):  # null allowed; NaN and off [0, 1] not
        value = table[name]
        off_scale = pc.or_(pc.less(value, 0.0), pc.greater(value, 1.0))
        rules.append((name, pc.or_(pc.is_nan(value), off_scale), "must be on [0, 1] or null"))
    return rules


def _check_gold_ids(table: pa.Table, path: str | Path) -> None:
    """``gold_id`` is the id of the slate item at ``gold_index``."""
    slates = table["slate"].combine_chunks()
    flat_positions = pc.add(
        slates.offsets.slice(0, len(slates)).cast(pa.int64()),
        pc.subtract(table["gold_index"].combine_chunks(), 1),
    )
    slate_gold_ids = pc.take(pc.struct_field(slates.values, "id"), flat_positions)
    gold_mismatch = pc.not_equal(slate_gold_ids, table["gold_id"].combine_chunks())
    if pc.any(pc.fill_null(gold_mismatch, False)).as_py():
        row = _first_bad_row(gold_mismatch)
        raise DataError("must equal slate[gold_index - 1].id", file=path, row=row, field="gold_id")


def dataset_files(path: str | Path) -> list[Path]:
    """The parquet files of a cleaned folder (train, validation) or the single file given."""
    path = Path(path)
    if path.is_dir():
        check_complete(path)  # a folder is a finished output, never a half-written one
        files = [
            path / f"{split}.parquet" for split in SPLITS if (path / f"{split}.parquet").exists()
        ]
        if not files:
            raise DataError("no train.parquet or validation.parquet in this folder", file=path)
        return files
    if not path.exists():
        raise DataError("no such file or folder", file=path)
    check_listed(path)  # a file of a finished output: checked against its entry
    return [path]


def read_dataset(path: str | Path, split: str | None = None) -> pa.Table:
    """Read and validate a cleaned folder or parquet file; optionally keep one split."""
    tables = []
    for file in dataset_files(path):
        try:
            table = pq.read_table(file)
        except (OSError, pa.ArrowInvalid) as err:
            raise DataError(f"not a readable parquet file ({err})", file=file) from None
        validate_table(table, file)
        tables.append(
            table.select(SCHEMA.names + [n for n in table.column_names if n not in SCHEMA.names])
        )
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    if split is not None:
        table = table.filter(pc.equal(table["split"], split))
    return table


def issue_rows(path: Path, issue: str):
    """One issue's rows of a parquet file in the contract (a pyarrow Table)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return table.filter(pc.equal(table["issue"], issue))


def issue_subset(dataset: Path, issue: str, out: Path) -> None:
    """The cleaned dataset restricted to one issue (truth files kept for the ceiling)."""
    import pyarrow.parquet as pq

    from grail.core.outputs import mark_complete

    out.mkdir(parents=True)
    for path in dataset.glob("*.parquet"):
        pq.write_table(issue_rows(path, issue), out / path.name)
    for name in ("truth.json", "truth_steps.csv"):
        if (dataset / name).is_file():
            shutil.copyfile(dataset / name, out / name)
    mark_complete(out, f"the {issue} part of a clean output")
