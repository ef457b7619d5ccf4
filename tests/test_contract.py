"""The dataset contract check names the file, row and column of a violation."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grail.core.errors import DataError
from grail.core.outputs import mark_complete
from grail.tasks.slate.contract import SCHEMA, read_dataset


def _row(**changes):
    slate = [
        {
            "id": "a",
            "title": "A",
            "channel": None,
            "duration_seconds": None,
            "views": None,
            "likes": None,
            "comments": None,
        },
        {
            "id": "b",
            "title": "B",
            "channel": None,
            "duration_seconds": None,
            "views": None,
            "likes": None,
            "comments": None,
        },
    ]
    return {
        "participant_id": "p",
        "session_id": "s",
        "study": "x",
        "issue": "gun_control",
        "step_index": 0,
        "current_video": None,
        "history": [],
        "slate": slate,
        "gold_index": 2,
        "gold_id": "b",
        "n_options": 2,
        "viewer": None,
        "opinion_before": None,
        "opinion_after": None,
        "opinion_direction": None,
        "split": "train",
    } | changes


def _write(tmp_path, rows, schema=SCHEMA):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_a_valid_file_reads_and_keeps_extra_columns(tmp_path):
    schema = SCHEMA.append(pa.field("note", pa.string()))
    path = _write(tmp_path, [_row(note="mine")], schema)
    table = read_dataset(path)
    assert table.num_rows == 1 and table.column_names[-1] == "note"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gold_index": 3}, "row 1, field gold_index: must be within 1..n_options"),
        ({"gold_id": "a"}, "row 1, field gold_id: must equal slate[gold_index - 1].id"),
        ({"n_options": 3}, "row 1, field n_options: must equal the slate's length"),
        ({"issue": "abortion"}, "row 1, field issue: must be one of"),
        ({"split": "test"}, "row 1, field split: must be one of"),
        ({"opinion_direction": "up"}, "row 1, field opinion_direction"),
    ],
)
def test_violations_name_file_row_and_field(tmp_path, change, message):
    path = _write(tmp_path, [_row(), _row(**change)])
    with pytest.raises(DataError) as err:
        read_dataset(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_missing_column_and_wrong_type(tmp_path):
    table = pa.Table.from_pylist([_row()], schema=SCHEMA)
    pq.write_table(table.drop_columns(["gold_id"]), tmp_path / "a.parquet")
    with pytest.raises(DataError, match="field gold_id: missing required column"):
        read_dataset(tmp_path / "a.parquet")
    bad = table.set_column(
        table.schema.get_field_index("gold_index"), "gold_index", pa.array(["2"])
    )
    pq.write_table(bad, tmp_path / "b.parquet")
    with pytest.raises(DataError, match="field gold_index: expected type int64, got string"):
        read_dataset(tmp_path / "b.parquet")


def test_split_filter_and_folder(tmp_path):
    pq.write_table(pa.Table.from_pylist([_row()], schema=SCHEMA), tmp_path / "train.parquet")
    pq.write_table(
        pa.Table.from_pylist([_row(split="validation")] * 2, schema=SCHEMA),
        tmp_path / "validation.parquet",
    )
    with pytest.raises(DataError, match="_COMPLETE.json"):  # parquet put in a folder by hand
        read_dataset(tmp_path)
    mark_complete(tmp_path, "a hand-made dataset")
    assert read_dataset(tmp_path).num_rows == 3
    assert read_dataset(tmp_path, split="validation").num_rows == 2
