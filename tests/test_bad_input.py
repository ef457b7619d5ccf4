"""Values that used to be accepted without a word are refused with one line naming the file,
row and field (exit 2) or counted in the audit."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from raw_builder import person, session, video, write_raw

from grail.clean.stage import clean
from grail.cli import main
from grail.core.errors import DataError, GrailError
from grail.tasks.slate.contract import read_dataset
from grail.train.config import parse_train_args

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "argv",
    [
        ["benchmark", "--data", "d", "--out", "o", "--limit", "-1"],
        ["benchmark", "--data", "d", "--out", "o", "--limit", "0"],
        ["clean", "--raw", "r", "--out", "o", "--opinion-tolerance", "-1"],
        ["clean", "--raw", "r", "--out", "o", "--validation-fraction", "1.5"],
    ],
)
def test_out_of_range_arguments_exit_2_with_one_line(argv, capsys):
    assert main(argv) == 2
    assert "expected" in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("field", ["max_train_rows", "max_eval_rows"])
def test_row_limits_below_one_are_refused(field):
    recipe = str(ROOT / "recipes" / "tiny" / "config_grpo.yaml")
    with pytest.raises(GrailError, match=f"{field} must be at least 1"):
        parse_train_args(["--config", recipe, f"--{field}", "-1"])


@pytest.mark.parametrize(
    ("views", "message"),
    [("-5", "cannot be negative"), ("1e20", "within int64"), ("nan", "within int64")],
)
def test_impossible_counts_name_the_file_line_and_field(tmp_path, views, message):
    raw = write_raw(
        tmp_path / "raw",
        [session("s1", "u1", ["a", "b"], [["b", "c"]])],
        [person("w1", "u1")],
        [video("a"), video("b", views=views), video("c")],
    )
    with pytest.raises(DataError, match=message) as error:
        clean(raw, tmp_path / "out")
    assert "video_metadata.csv: line 3, field views" in str(error.value)


def test_conflicting_duplicate_rows_are_counted(tmp_path):
    raw = write_raw(
        tmp_path / "raw",
        [session("s1", "u1", ["a", "b"], [["b", "c"]])],
        [person("w1", "u1"), person("w1", "u1", pid1="Republican")],
        [video("a"), video("b"), video("b", title="Another title"), video("c")],
    )
    report = clean(raw, tmp_path / "out")
    assert report["accounting"]["repairs"] == {
        "conflicting_metadata_rows": 1,
        "conflicting_survey_rows": 1,
    }


@pytest.mark.parametrize("value", [5.0, math.nan, -0.1])
def test_a_dataset_with_an_opinion_off_its_scale_is_refused(default_clean, tmp_path, value):
    table = pq.read_table(default_clean / "validation.parquet")
    column = table["opinion_before"].to_pylist()
    column[3] = value
    table = table.set_column(
        table.column_names.index("opinion_before"), "opinion_before", pa.array(column)
    )
    pq.write_table(table, tmp_path / "validation.parquet")
    with pytest.raises(
        DataError, match="opinion_before: must be on \\[0, 1\\]|field opinion_before"
    ):
        read_dataset(tmp_path / "validation.parquet")


def _with_slate(default_clean, tmp_path, change) -> Path:
    original = pq.read_table(default_clean / "validation.parquet")
    rows = original.to_pylist()[:5]
    change(rows[2])
    table = pa.Table.from_pylist(rows, schema=original.schema)
    pq.write_table(table, tmp_path / "validation.parquet")
    return tmp_path / "validation.parquet"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda row: row["slate"].__setitem__(1, None), "a slate holds a null item"),
        (lambda row: row["slate"][1].__setitem__("id", None), "a slate item has no id"),
    ],
)
def test_broken_slates_name_the_row(default_clean, tmp_path, change, message):
    path = _with_slate(default_clean, tmp_path, change)
    with pytest.raises(DataError, match=message) as error:
        read_dataset(path)
    assert "row 2" in str(error.value)


def test_a_slate_struct_without_id_is_refused(default_clean, tmp_path):
    def drop_ids(row):
        row["slate"] = [{k: v for k, v in item.items() if k != "id"} for item in row["slate"]]

    rows = pq.read_table(default_clean / "validation.parquet").to_pylist()[:3]
    for row in rows:
        drop_ids(row)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "v.parquet")
    with pytest.raises(DataError, match="slate"):
        read_dataset(tmp_path / "v.parquet")


def test_a_folder_named_like_the_sessions_file_and_deep_json(tiny_raw, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sessions.json").mkdir()
    with pytest.raises(DataError, match="found a folder"):
        clean(broken, tmp_path / "out")
    (tiny_raw / "sessions.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match="nested too deeply"):
        clean(tiny_raw, tmp_path / "out2")


def test_recipe_values_of_the_wrong_kind_fail_before_any_model_loads(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: /nowhere\nlearning_rate: [1, 2]\n")
    with pytest.raises(GrailError, match=r"learning_rate: \[1, 2\] is not a valid value"):
        parse_train_args(["--config", str(recipe)])


def test_secrets_are_masked_in_error_lines(tmp_path, capsys):
    status = main(["export", "--model", str(tmp_path / "none"), "--dest", "file:///x"])
    assert status == 2
    from grail.core.errors import mask_secrets

    assert mask_secrets("s3://u:hunter2@h/x") == "s3://u:***@h/x"


def test_a_missing_model_or_an_output_that_is_a_file_is_one_line(
    default_clean, tmp_path, error_line
):
    import subprocess
    import sys

    recipe = str(ROOT / "recipes" / "tiny" / "config_grpo.yaml")
    (tmp_path / "file").write_text("x")
    train = ["train", "--config", recipe, "--dataset", str(default_clean)]
    train += [
        "--model_name_or_path",
        str(tmp_path / "nowhere"),
        "--output_dir",
        str(tmp_path / "o"),
    ]
    assert "nowhere" in error_line(train)
    benchmark = ["benchmark", "--data", str(default_clean), "--out", str(tmp_path / "file")]
    done = subprocess.run(
        [sys.executable, "-m", "grail.cli", *benchmark, "--limit", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("grail: error: ")


def test_both_benchmarks_refuse_their_output_before_scoring(small_clean, tmp_path, monkeypatch):
    """An --out that is a file, or someone's folder, is refused before the baselines are
    scored (the default study's took about 40 s on 2 cores before the refusal came)."""
    from grail.benchmark.stage import run
    from grail.tasks.slate.benchmark import run as slate_run
    from grail.tasks.summarize import benchmark as summarize_benchmark
    from grail.tasks.summarize.clean import clean_documents
    from grail.tasks.summarize.documents import simulate_documents

    def scored(*args, **kwargs):
        raise AssertionError("scored before the output was checked")

    monkeypatch.setattr(slate_run, "reference_systems", scored)
    monkeypatch.setattr(summarize_benchmark, "expand_specs", scored)
    (tmp_path / "file").write_text("x")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("someone's")
    simulate_documents(tmp_path / "raw", documents=8, seed=3)
    clean_documents(tmp_path / "raw", tmp_path / "documents", validation_documents=2)
    for out in (tmp_path / "file", tmp_path / "theirs"):
        with pytest.raises(GrailError, match=str(out)):
            run(small_clean, out, limit=5)
        with pytest.raises(GrailError, match=str(out)):
            summarize_benchmark.benchmark_documents(tmp_path / "documents", out, limit=2)
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "someone's"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--beta", "nan"], "beta must be a finite number, got nan"),
        (["--learning_rate", "inf"], "learning_rate must be a finite number, got inf"),
        (["--top_p", "nan"], "top_p must be a finite number, got nan"),
        (["--reward_weights", "1", "nan", "1"], "reward_weights must be a finite number"),
        (["--epsilon_high", "-1"], "epsilon_high must be >= 0, got -1"),
        (["--save_steps", "-1"], "save_steps must be > 0, got -1"),
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be >= 1"),
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps must be >= 1"),
    ],
)
def test_non_finite_and_meaningless_training_values_are_one_line(option, message, capsys):
    """NaN passes every comparison a range makes (`nan < 0` is False): before, `--beta nan`
    trained a model of NaN weights and exported it with exit 0; batch size 0 was a trace."""
    recipe = str(ROOT / "recipes" / "tiny" / "config_grpo.yaml")
    assert main(["train", "--config", recipe, *option]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"grail: error: command line: {message}"), last


def test_a_recipe_with_a_nan_names_the_recipe(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    text = (ROOT / "recipes" / "tiny" / "config_grpo.yaml").read_text()
    recipe.write_text(re.sub(r"(?m)^beta: .*$", "beta: .nan", text))
    assert main(["train", "--config", str(recipe)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"grail: error: {recipe}: beta") and "nan" in line, line


def test_other_commands_refuse_non_finite_floats(capsys):
    """`grail generate --temperature nan` had no check of its own: it sampled NaN logits."""
    assert (
        main(["generate", "--data", "d", "--out", "o", "--model", "m", "--temperature", "nan"]) == 2
    )
    assert "command line: temperature must be a finite number, got nan" in capsys.readouterr().err


def test_a_full_disk_is_one_line_and_leaves_no_output(tiny_raw, tmp_path, monkeypatch, capsys):
    """Out of disk while clean writes its parquet (the OS's ENOSPC, as pyarrow raises it), or
    while training saves (torch's zip writer says it in its own words): one line naming what
    to do, exit 2, and no output folder left half written."""
    import errno

    import pyarrow.parquet as pq

    from grail.cli import main
    from grail.core.errors import describe

    def full(table, where, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(where))

    monkeypatch.setattr(pq, "write_table", full)
    out = tmp_path / "clean"
    assert main(["clean", "--raw", str(tiny_raw), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(".parquet: No space left on device"), line
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == [tiny_raw.name]
    saved = RuntimeError(
        "[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0;"
        " PytorchStreamWriter failed writing file data/0: file write failed"
    )
    assert describe(saved)[0] == "input" and "no space left" in describe(saved)[1]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda h, rows: (h.replace("urlid", "urlid,urlid", 1), rows), "field urlid"),
        (lambda h, rows: (h, [rows[0] + ",extra"] + rows[1:]), "line 2"),
    ],
)
def test_a_survey_csv_whose_cells_would_be_lost_is_one_line(tiny_raw, tmp_path, edit, message):
    """A header naming ``urlid`` twice dropped 61 of 231 rows as ``no_survey``, seen only in
    audit.json (probe B10); a row with more cells than the header lost them. Both name the
    file, and the line or the column."""
    import shutil

    raw = Path(shutil.copytree(tiny_raw, tmp_path / "raw-edited"))
    survey = sorted((raw / "surveys").glob("*.csv"))[0]
    header, *rows = survey.read_text().splitlines()
    header, rows = edit(header, rows)
    survey.write_text("\n".join([header, *rows]) + "\n")
    with pytest.raises(DataError, match=message) as error:
        clean(raw, tmp_path / "out")
    assert survey.name in str(error.value) and not (tmp_path / "out").exists()
