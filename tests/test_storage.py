"""Object-store downloads stay inside their folder: keys with ``../`` or an absolute path are
refused with one line naming the key (exit 2), against a real S3 endpoint (moto's server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from tiny_settings import SMOKE

from grail.core.errors import DataError
from grail.core.storage import Location, download_folder

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("key", ["ds/../../../../{escape}/pwned.txt", "ds//{escape}/pwned.txt"])
def test_a_key_that_escapes_the_download_folder_is_refused(s3, tmp_path, key):
    escape = tmp_path / "outside"
    client = boto3.client("s3")
    client.put_object(Bucket=s3, Key="ds/train.parquet", Body=b"fine")
    client.put_object(Bucket=s3, Key=key.format(escape=str(escape).lstrip("/")), Body=b"x")
    with pytest.raises(DataError, match="refused, it would be written outside"):
        download_folder(Location.parse(f"s3://{s3}/ds"), tmp_path / "in")
    assert not escape.exists()
    assert not (tmp_path / "in" / "train.parquet").exists()  # nothing written before the check


def test_grail_train_refuses_such_a_dataset_in_one_line(s3, tmp_path, tiny_model):
    boto3.client("s3").put_object(Bucket=s3, Key="ds/../../x.txt", Body=b"x")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grail.cli",
            "train",
            "--config",
            str(ROOT / "recipes" / "tiny" / "config_grpo.yaml"),
            "--dataset",
            f"s3://{s3}/ds",
            "--model_name_or_path",
            str(tiny_model),
            "--output_dir",
            str(tmp_path / "out"),
            "--max_steps",
            "3",
            *SMOKE,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("grail: error: ") and "../../x.txt" in lines[-1]
    assert "Traceback" not in done.stderr
