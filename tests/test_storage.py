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


def test_grail_train_refuses_such_a_dataset_in_one_line(s3, tmp_path, tiny_policy):
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
            str(tiny_policy),
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


def test_an_invalid_bucket_name_says_which_rule_it_breaks(s3, tmp_path, capsys):
    """It said only "Parameter validation failed:" (botocore's first line)."""
    from grail.cli import main

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    status = main(["export", "--model", str(tmp_path / "model"), "--dest", "s3://bad!bucket/x"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "s3://bad!bucket/x" in err and 'Invalid bucket name "bad!bucket"' in err, err


def test_access_denied_names_the_credentials_without_the_secret(monkeypatch):
    """A 403 said "Forbidden"; now which access key (its last four characters) and where boto3
    found it. The error is botocore's own ClientError, as a HeadObject refused by S3 raises."""
    from botocore.exceptions import ClientError

    from grail.core.storage import storage_error

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE1234")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    reply = {"Error": {"Code": "403", "Message": "Forbidden"}}
    reply["ResponseMetadata"] = {"HTTPStatusCode": 403}
    line = storage_error(ClientError(reply, "HeadObject"), "export to s3://b/x")
    assert line.startswith("export to s3://b/x: access denied (403) with access key ...1234")
    assert "environment variables" in line and "very-secret" not in line and "AKIAEX" not in line
    assert storage_error(ValueError("x"), "w") is None


def test_a_killed_writers_unfinished_multipart_uploads_are_aborted(s3, tmp_path):
    """A killed export leaves a multipart upload in progress (parts stored, invisible to
    listings); the next writer of that place, holding its lease, aborts it."""
    from grail.export.stage import export

    client = boto3.client("s3")
    started = client.create_multipart_upload(Bucket=s3, Key="exports/r1/model/model.safetensors")
    client.upload_part(
        Bucket=s3,
        Key="exports/r1/model/model.safetensors",
        UploadId=started["UploadId"],
        PartNumber=1,
        Body=b"x" * 1024,
    )
    assert client.list_multipart_uploads(Bucket=s3, Prefix="exports/r1/").get("Uploads")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    export(str(model), None, f"s3://{s3}/exports/r1")
    assert not client.list_multipart_uploads(Bucket=s3, Prefix="exports/r1/").get("Uploads")
    assert client.list_multipart_uploads(Bucket=s3).get("Uploads") is None
