"""Export changes only what an export wrote: each refused destination (a user's folder, the
current folder, the model folder, the parent of other exports, keys that would not be stored as
typed) keeps every file byte for byte, through the API and the CLI alike, in a folder and on S3
(moto's server); a re-export still replaces the previous one, and a killed one resumes."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

import grail.export.stage as publish
from grail.cli import main
from grail.core.errors import GrailError
from grail.core.storage import check_uri as check_destination
from grail.export.stage import MANIFEST, PENDING, export

MODEL = {"config.json": b"{}", "model.safetensors": b"w" * 5000, "shard-2.bin": b"s2"}


def tree(folder: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


class Store:
    """A destination root, a folder or an S3 bucket, and everything the test can see: every file
    below the test's folder (the sources included) and, on S3, every object in the bucket."""

    def __init__(self, root: str, local: Path):
        self.root, self.local = root, local

    def dest(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def put(self, name: str, data: bytes) -> None:
        if self.root.startswith("s3://"):
            import boto3

            boto3.client("s3").put_object(Bucket=self.root[5:], Key=name, Body=data)
        else:
            tree(Path(self.root), {name: data})

    def files(self, *parts: str) -> dict[str, bytes]:
        """Name -> bytes below `parts` of the root."""
        prefix = "".join(f"{part}/" for part in parts)
        if not self.root.startswith("s3://"):
            folder = Path(self.root, prefix)
            found = sorted(p for p in folder.rglob("*") if p.is_file())
            return {p.relative_to(folder).as_posix(): p.read_bytes() for p in found}
        import boto3

        client, bucket = boto3.client("s3"), self.root[5:]
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return {
            k[len(prefix) :]: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys
        }

    def snapshot(self) -> dict[str, bytes]:
        found = {p.as_posix(): p.read_bytes() for p in self.local.rglob("*") if p.is_file()}
        return found | (
            {f"s3:{k}": v for k, v in self.files().items()} if "s3:" in self.root else {}
        )


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "folder":
        return Store(str(tmp_path / "store"), tmp_path)
    return Store(f"s3://{request.getfixturevalue('s3')}", tmp_path)


@pytest.fixture
def model(tmp_path) -> Path:
    return tree(tmp_path / "run1" / "model", MODEL | {"checkpoint-2/trainer_state.json": b"{}"})


@pytest.fixture
def bench(tmp_path) -> Path:
    return tree(tmp_path / "run1" / "bench", {"report.md": b"# r"})


def refused(capsys, store: Store, model: Path, dest: str, match: str) -> str:
    """The export of `model` to `dest` is refused by the API (a GrailError) and the CLI (exit 2,
    one line) with every file the test can see kept byte for byte; returns the CLI's line."""
    before = store.snapshot()
    with pytest.raises(GrailError, match=match):
        export(model, None, dest)
    status = main(["export", "--model", str(model), "--dest", dest])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1, lines
    assert store.snapshot() == before
    return lines[0]


def test_a_folder_of_someone_elses_files_is_refused_and_kept(store, model, capsys):
    store.put("userdir/notes.txt", b"my notes")
    store.put("userdir/data/x.csv", b"1,2\n")
    line = refused(capsys, store, model, store.dest("userdir"), "holds files no export here wrote")
    assert store.dest("userdir") in line and "(data/x.csv, 2 in all)" in line


def test_a_file_at_a_name_the_export_writes_is_not_overwritten(store, model, capsys):
    store.put("userdir/model/config.json", b'{"mine": 1}')
    line = refused(capsys, store, model, store.dest("userdir"), "no export here wrote")
    assert "(model/config.json, 1 in all)" in line


def test_a_manifest_json_that_is_not_an_exports_is_not_replaced(store, model, capsys):
    store.put("site/manifest.json", b'{"name": "my web app"}')
    refused(capsys, store, model, store.dest("site"), r"wrote \(manifest.json, 1 in all\)")


@pytest.mark.parametrize("where", ["root", "runs"])
def test_the_parent_of_other_exports_is_refused_and_they_stay_complete(
    store, model, tmp_path, capsys, where
):
    """`--dest s3://exp/runs` once deleted the run-keyed exports below it."""
    other = tree(tmp_path / "run2" / "model", {"config.json": b'{"run": 2}'})
    export(model, None, store.dest("runs", "r1", "grpo", "gun_control"))
    export(other, None, store.dest("runs", "r2", "grpo", "gun_control"))
    dest = store.dest() if where == "root" else store.dest("runs")
    line = refused(capsys, store, model, dest, "holds another export")
    below = "runs/r1" if where == "root" else "r1"
    assert f"({below}/grpo/gun_control/{MANIFEST})" in line
    for run in ("r1", "r2"):
        exported = store.files("runs", run, "grpo", "gun_control")
        manifest = json.loads(exported.pop(MANIFEST))
        assert set(exported) == set(manifest["files"])


def test_an_unfinished_export_below_is_another_export(store, model, capsys):
    store.put(f"runs/r1/{PENDING}", json.dumps({"names": ["model/config.json"]}).encode())
    store.put("runs/r1/model/config.json", b"{}")
    refused(capsys, store, model, store.dest("runs"), f"another export \\(r1/{PENDING}\\)")


def test_the_current_folder_with_a_sibling_run_is_refused(tmp_path, monkeypatch, capsys):
    """`--dest .` once deleted 76 files, a sibling run among them."""
    work = tmp_path / "work"
    model = tree(work / "run1" / "model", MODEL)
    tree(work / "run2" / "model", MODEL | {"checkpoint-4/optimizer.pt": b"o"})
    tree(work, {"notes.txt": b"n"})
    store = Store(str(work), tmp_path)
    monkeypatch.chdir(work)
    line = refused(capsys, store, Path("run1/model"), ".", "holds the source folder run1/model")
    assert f"file://{work}" in line
    refused(capsys, store, model, ".", r"holds the source folder")
    elsewhere = tree(tmp_path / "elsewhere" / "model", MODEL)
    refused(capsys, store, elsewhere, ".", r"no export here wrote \(notes.txt, 8 in all\)")


@pytest.mark.parametrize(
    ("dest", "relation"),
    [("run1/model", "is"), ("run1/model/export", "is inside"), ("run1", "holds")],
)
def test_the_model_folder_inside_it_or_above_it_is_refused(tmp_path, model, capsys, dest, relation):
    """`--dest <the model folder>` once deleted its checkpoints and trainer state."""
    line = refused(capsys, Store("", tmp_path), model, str(tmp_path / dest), relation)
    assert f"{relation} the source folder {model}" in line


def test_the_benchmark_folder_is_a_source_too(tmp_path, model, bench):
    before = Store("", tmp_path).snapshot()
    with pytest.raises(GrailError, match="is the source folder .*bench"):
        export(model, bench, str(bench))
    assert Store("", tmp_path).snapshot() == before


@pytest.mark.parametrize(
    ("dest", "match"),
    [
        ("a/../../b", r"a '\.\.' segment in the key is refused"),
        ("a/./b", r"a '\.' segment in the key"),
        ("a//b", "an empty segment in the key"),
        ("/abs", "a key starting with '/' is refused"),
        ("a#frag", "'#' are refused"),
    ],
)
def test_s3_keys_not_stored_as_typed_are_refused_before_anything_is_written(
    s3, tmp_path, model, capsys, dest, match
):
    """`s3://exp/a/../../b` was stored as literal `a/../../b/...` keys."""
    store = Store(f"s3://{s3}", tmp_path)
    line = refused(capsys, store, model, f"s3://{s3}/{dest}", match)
    assert f"s3://{s3}/{dest}" in line and store.files() == {}


@pytest.mark.parametrize("form", ["{root}/ok/../out", "file://{root}/ok/../out", "ok/../out"])
def test_a_folder_path_with_dotdot_is_refused(tmp_path, model, monkeypatch, capsys, form):
    monkeypatch.chdir(tmp_path)
    dest = form.format(root=tmp_path)
    refused(capsys, Store("", tmp_path), model, dest, r"a '\.\.' segment is refused")
    assert not (tmp_path / "out").exists() and not (tmp_path / "ok").exists()


def test_a_file_uri_with_a_host_is_refused(tmp_path, model, monkeypatch, capsys):
    """`file://out` parses as host `out` and an empty path: the current folder."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, Store("", tmp_path), model, "file://out", "file:// takes an absolute path")


def test_an_s3_folder_marker_is_not_a_foreign_file(s3, tmp_path, model):
    """A console's "create folder" leaves an empty key ending in "/": the export goes there,
    and leaves the marker."""
    store = Store(f"s3://{s3}", tmp_path)
    store.put("exports/run1/", b"")
    export(model, None, store.dest("exports", "run1"))
    assert "" in store.files("exports", "run1") and MANIFEST in store.files("exports", "run1")


def test_a_lease_renewal_s_copy_is_not_a_foreign_file(tmp_path, model):
    """A renewal writes the lease's new record beside it, then renames it over the lease
    (grail.core.lease): the export's own listing may catch that copy while it lists."""
    store = Store(str(tmp_path / "dest"), tmp_path)
    store.put("run1/._LEASE.json.123.456", b'{"holder": "x"}')
    export(model, None, store.dest("run1"))
    assert MANIFEST in store.files("run1")


def test_check_destination_keeps_plain_destinations(tmp_path):
    assert check_destination("s3://b").prefix == ""
    assert check_destination("s3://b/runs/r1/grpo/").prefix == "runs/r1/grpo"
    assert check_destination(".").local_path == Path.cwd()
    assert check_destination(f"file://{tmp_path}/a").local_path == tmp_path / "a"
    assert check_destination(f"file://localhost{tmp_path}/a").local_path == tmp_path / "a"


def test_a_reexport_replaces_the_previous_one(store, model, bench):
    """Files the previous manifest listed and the new export lacks go; a changed file is
    replaced; a tampered one (same size) is repaired; nothing else is touched."""
    dest = store.dest("exports", "run1")
    store.put("exports/run1-notes.txt", b"a sibling prefix, not below the export")
    export(model, bench, dest)
    name = "exports/run1/model/model.safetensors"
    store.put(name, b"x" * 5000)
    (model / "shard-2.bin").unlink()
    (model / "config.json").write_bytes(b'{"v": 2}')
    again = export(model, None, dest)
    assert sorted(again["deleted"]) == ["benchmark/report.md", "model/shard-2.bin"]
    assert sorted(again["uploaded"]) == [MANIFEST, "model/config.json", "model/model.safetensors"]
    exported = store.files("exports", "run1")
    assert json.loads(exported.pop(MANIFEST))["files"].keys() == exported.keys()
    assert exported == {"model/config.json": b'{"v": 2}', "model/model.safetensors": b"w" * 5000}
    assert store.files("exports")["run1-notes.txt"] == b"a sibling prefix, not below the export"
    assert export(model, None, dest)["uploaded"] == []


def test_a_file_put_by_hand_into_an_export_is_refused_and_kept(store, model, capsys):
    dest = store.dest("exports", "run1")
    export(model, None, dest)
    store.put("exports/run1/model/extra.bin", b"mine")
    line = refused(capsys, store, model, dest, r"no export here wrote \(model/extra.bin, 1 in")
    assert dest in line
    with pytest.raises(GrailError, match="model/extra.bin"):
        export(model, None, dest, keep_stale=True)  # kept or not, it is not the export's


def test_an_unreadable_manifest_is_no_export_s_record(store, model):
    dest = store.dest("exports", "run1")
    export(model, None, dest)
    store.put(f"exports/run1/{MANIFEST}", b"{not json")
    before = store.snapshot()
    with pytest.raises(GrailError, match=r"no export here wrote \(manifest.json, 1 in all\)"):
        export(model, None, dest)
    assert store.snapshot() == before


def test_files_already_holding_the_exported_bytes_are_taken_as_its_own(store, model):
    """An export whose manifest is gone (deleted by hand, or written by a grail without
    `PENDING` and killed) completes: its files hold exactly what this export writes."""
    dest = store.dest("exports", "run1")
    store.put("exports/run1/model/config.json", MODEL["config.json"])
    done = export(model, None, dest)
    assert sorted(done["uploaded"]) == [MANIFEST, "model/model.safetensors", "model/shard-2.bin"]


def test_keep_stale_keeps_the_previous_exports_files_and_still_owns_them(store, model):
    dest = store.dest("exports", "run1")
    export(model, None, dest)
    (model / "shard-2.bin").unlink()
    kept = export(model, None, dest, keep_stale=True)
    assert kept["deleted"] == [] and kept["manifest"]["kept_stale"] == ["model/shard-2.bin"]
    assert export(model, None, dest, keep_stale=True)["uploaded"] == []
    assert export(model, None, dest)["deleted"] == ["model/shard-2.bin"]
    assert "kept_stale" not in json.loads(store.files("exports", "run1")[MANIFEST])


def test_a_killed_reexport_resumes_and_removes_what_the_previous_listed(store, model, monkeypatch):
    """Killed after one upload: no manifest (it looks unfinished) but `PENDING` names every file
    it may have left, so the rerun finds them its own and finishes the job."""
    dest = store.dest("exports", "run1")
    export(model, None, dest)
    (model / "shard-2.bin").unlink()
    tree(model, {"model.safetensors": b"v" * 5000, "shard-3.bin": b"s3"})
    real_put, uploaded = publish.put, []

    def killed_on_the_second_upload(local, location):
        if uploaded:
            raise KeyboardInterrupt
        uploaded.append(real_put(local, location))

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(publish, "put", killed_on_the_second_upload)
        export(model, None, dest)
    left = store.files("exports", "run1")
    assert MANIFEST not in left and "model/shard-2.bin" in left
    assert set(json.loads(left[PENDING])["names"]) >= set(left) - {PENDING}
    done = export(model, None, dest)
    assert done["deleted"] == ["model/shard-2.bin"]
    exported = store.files("exports", "run1")
    assert set(exported) == {
        MANIFEST,
        "model/config.json",
        "model/model.safetensors",
        "model/shard-3.bin",
    }


def _export_in_a_process(model: str, dest: str, start: float) -> str:
    """One exporter (its own process), starting at `start`: "ok" ("ok, waited" when it found
    the other holding the destination and waited for it), or its refusal."""
    import logging
    import time

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("grail.core.lease").addHandler(handler)
    logging.getLogger("grail.core.lease").setLevel(logging.INFO)
    time.sleep(max(start - time.time(), 0))
    try:
        export(model, None, dest)
    except GrailError as err:
        return str(err)
    return "ok, waited" if any("held by" in line for line in seen) else "ok"


@pytest.mark.parametrize("scheme", ["s3", "file"])
def test_concurrent_exports_to_one_destination_never_leave_a_mixed_one(scheme, s3, tmp_path):
    """The probe's case: two exports to one destination at once left a manifest that looked
    complete over files of the other export. Two processes export different models to one
    destination at once, many rounds: each either finishes or is refused with one line (the
    destination's lease), and what is left is always one whole export, every stored file equal
    to its manifest's sha256 and size."""
    import hashlib
    import time
    from concurrent.futures import ProcessPoolExecutor

    models = [
        str(tree(tmp_path / f"model-{i}", {k: v * 400 + bytes([i]) for k, v in MODEL.items()}))
        for i in range(2)
    ]
    root = f"s3://{s3}" if scheme == "s3" else str(tmp_path / "store")
    store = Store(root, tmp_path)
    outcomes = set()
    with ProcessPoolExecutor(2) as pool:
        for round_ in range(10):
            dest = store.dest(f"round-{round_}")
            start = [time.time() + 0.5] * 2  # both at once
            results = list(pool.map(_export_in_a_process, models, [dest, dest], start))
            outcomes.add(tuple(sorted(r if r.startswith("ok") else "refused" for r in results)))
            assert "ok" in results, results  # one ran without waiting
            for result in results:
                assert result.startswith("ok") or "is in use by another export" in result, result
            stored = store.files(f"round-{round_}")
            manifest = json.loads(stored.pop(MANIFEST))
            assert set(stored) == set(manifest["files"]), sorted(stored)
            for name, data in stored.items():
                entry = manifest["files"][name]
                assert hashlib.sha256(data).hexdigest() == entry["sha256"], (round_, name)
                assert len(data) == entry["size"]
    # The race happened: in some round one exporter found the other holding the destination.
    assert any("ok, waited" in o or "refused" in o for o in outcomes), outcomes


def test_a_linked_folder_inside_the_destination_is_never_written_through(tmp_path, model, capsys):
    """Before: `dest/model -> victim/` had victim/config.json overwritten (the listing does not
    descend into a linked folder, so the foreign-file check never saw it)."""
    victim = tree(tmp_path / "victim", {"config.json": b"the victim's"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "model").symlink_to(victim, target_is_directory=True)
    store = Store(str(dest), tmp_path)
    line = refused(capsys, store, model, str(dest), "model is a symbolic link")
    assert "never writes through a link" in line
    assert (victim / "config.json").read_bytes() == b"the victim's"


@pytest.mark.parametrize("record", [PENDING, "_LEASE.json"])
def test_a_dangling_record_link_creates_nothing_outside(tmp_path, model, capsys, record):
    outside = tmp_path / "outside" / "created.json"
    outside.parent.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / record).symlink_to(outside)
    store = Store(str(dest), tmp_path)
    refused(capsys, store, model, str(dest), f"{record} is a symbolic link")
    assert not outside.exists()


def test_a_stale_file_edited_after_the_export_is_kept_and_named(store, model, bench, caplog):
    """Before: a hand-edited benchmark/report.md was removed as stale. Now it is kept, named
    in one line, and no longer the export's (the next export stops at it)."""
    dest = store.dest("exports", "run1")
    export(model, bench, dest)
    store.put("exports/run1/benchmark/report.md", b"# r, with my notes")
    again = export(model, None, dest)
    assert again["deleted"] == []
    assert store.files("exports", "run1")["benchmark/report.md"] == b"# r, with my notes"
    assert "kept benchmark/report.md (1 in all): changed since an export wrote it" in caplog.text
    assert "benchmark/report.md" not in json.loads(store.files("exports", "run1")[MANIFEST])
    with pytest.raises(GrailError, match=r"no export here wrote \(benchmark/report.md"):
        export(model, None, dest)


def test_a_file_edited_after_the_export_is_repaired_and_named(store, model, bench, caplog):
    """The re-probe: a rerun overwrote an exported benchmark/report.md edited since, silently
    (dropped from the export, such a file is kept and named). The export owns the names its
    manifest lists and repairs them, but names what it replaced."""
    dest = store.dest("exports", "run1")
    export(model, bench, dest)
    store.put("exports/run1/benchmark/report.md", b"# r, with my notes")
    (bench / "report.md").write_bytes(b"# r 2")  # the rerun writes report.md anew
    export(model, bench, dest)
    assert store.files("exports", "run1")["benchmark/report.md"] == b"# r 2"
    assert "replaced benchmark/report.md (1 in all): changed since an export wrote it" in (
        caplog.text
    )


def test_an_export_inside_another_export_is_refused(store, model, capsys):
    """Before: allowed, and then the outer export's rerun stopped at the inner one's files."""
    export(model, None, store.dest("exports", "run1"))
    line = refused(
        capsys, store, model, store.dest("exports", "run1", "inner"), "is inside another export"
    )
    assert MANIFEST in line
    assert export(model, None, store.dest("exports", "run1"))["uploaded"] == []


def test_only_export_writes_inside_an_export_and_it_copies_no_claim(tmp_path, model, capsys):
    """The probe: `grail train --output_dir <an export>/model` trusted the `_WRITER.json`
    export had copied there and broke 4 of 12 files the manifest lists. Export copies no
    command's claim, and no command writes inside an export (its folders, or a new one)."""
    from types import SimpleNamespace

    from grail.core.outputs import EXPORT_RECORDS
    from grail.train.stage import claim_output_dir

    assert EXPORT_RECORDS == (MANIFEST, PENDING)
    claims = ("_WRITER.json", "_RUN.json", "_COMPLETE.node-1-of-2.json", "._WRITER.json.77")
    tree(model, {name: b"{}" for name in claims})
    dest = tmp_path / "export"
    export(model, None, str(dest))
    exported = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert not {f"model/{name}" for name in claims} & exported
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    for inside in (dest / "model", dest / "model" / "more", dest / "fresh"):
        config = SimpleNamespace(
            output_dir=str(inside), dataset=None, sft_dataset=None, sft_teacher=None,
            sft_reuse=None, discriminator_model=None, process_index=0,
            resume_from_checkpoint=None, checkpoint_uri=None,
            main_process_first=lambda **_: contextlib.nullcontext(),
        )  # fmt: skip
        with pytest.raises(GrailError, match="is inside an export"):
            claim_output_dir(config, SimpleNamespace(model_name_or_path=None))
        status = main(["simulate", "--out", str(inside), "--participants", "10"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and "is inside an export" in lines[0], lines
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    assert not (dest / "fresh").exists()


def test_a_link_to_an_export_is_still_inside_it(tmp_path, model, capsys):
    """The hostile probe reached inside an export through a link to one of its folders: an
    output written there, and an export inside the export."""
    dest = tmp_path / "export"
    export(model, None, str(dest))
    link = tmp_path / "LE"
    link.symlink_to(dest / "model")
    status = main(["simulate", "--out", str(link / "x"), "--participants", "10"])
    assert status == 2 and "is inside an export" in capsys.readouterr().err
    with pytest.raises(GrailError, match="is inside another export"):
        export(model, None, str(link / "E2"))
    assert not (dest / "model" / "x").exists() and not (dest / "model" / "E2").exists()


@pytest.mark.parametrize(
    "record",
    [
        (PENDING, {"names": ["thesis.txt"]}),
        (MANIFEST, {"files": {}, "kept_stale": ["thesis.txt"]}),
        (MANIFEST, {"files": {"thesis.txt": 1}}),
    ],
    ids=["pending-names", "kept-stale", "bare-entry"],
)
def test_a_hand_written_export_record_hands_no_file_over(tmp_path, model, capsys, record):
    """The hostile probe: a one-line `manifest.pending.json` (or a manifest with `kept_stale`
    or a bare entry) made export delete the user's file. A record counts only for the
    destination it names, and a file only with its recorded size and sha256."""
    dest = tmp_path / "E5"
    dest.mkdir()
    (dest / "thesis.txt").write_text("precious\n")
    name, body = record
    (dest / name).write_text(json.dumps(body))
    with pytest.raises(GrailError):
        export(model, None, str(dest))
    assert (dest / "thesis.txt").read_text() == "precious\n"


def test_export_copies_no_lease_and_no_link_out_of_the_model(tmp_path, model):
    """The hostile probe: export copied a `_LEASE.json` and followed a file link out of the
    model folder (another file's bytes exported under the link's name)."""
    tree(model, {"_LEASE.json": b"{}"})
    dest = tmp_path / "export"
    export(model, None, str(dest))
    assert not (dest / "model" / "_LEASE.json").exists()
    (tmp_path / "secret.txt").write_text("not the model's\n")
    (model / "stolen").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(GrailError, match="stolen is a symbolic link"):
        export(model, None, str(tmp_path / "export2"))


def test_a_reexport_never_writes_through_a_hard_linked_backup(tmp_path, model):
    """A backup made of hard links (``cp -al``, ``rsync --link-dest``) shares its files with the
    export: a re-export replaces each file it changes (a new file renamed over the name), so
    the backup keeps the bytes its own manifest records."""
    import os

    from grail.core.outputs import sha256

    dest, backup = tmp_path / "hl1", tmp_path / "hl1.bak"
    export(model, None, str(dest))
    for path in sorted(p for p in dest.rglob("*") if p.is_file()):
        (backup / path.relative_to(dest)).parent.mkdir(parents=True, exist_ok=True)
        os.link(path, backup / path.relative_to(dest))
    before = {p: p.read_bytes() for p in backup.rglob("*") if p.is_file()}
    (model / "model.safetensors").write_bytes(b"v" * 5000)
    (model / "config.json").write_bytes(b'{"v": 2}')
    again = export(model, None, str(dest))
    assert "model/model.safetensors" in again["uploaded"]
    assert {p: p.read_bytes() for p in backup.rglob("*") if p.is_file()} == before
    for name, entry in json.loads((backup / MANIFEST).read_text())["files"].items():
        assert sha256(backup / name) == entry["sha256"], name
    assert (dest / "model" / "model.safetensors").read_bytes() == b"v" * 5000


def test_a_promoted_export_is_never_replaced_by_another_run(store, model, capsys):
    """An export the gate promoted is a champion's source: another run's export there (the CLI,
    or a pipeline run that was not promoted) is refused with every byte kept; the same
    pipeline run exporting again, promoted again (a retried task), is not."""
    dest = store.dest("exports", "r1")
    promoted = {"promoted": True, "reason": "promote_if: always"}
    export(model, None, dest, run_ids={"pipeline": "p1"}, promotion=promoted)
    (model / "model.safetensors").write_bytes(b"v" * 5000)
    refused(capsys, store, model, dest, "holds a promoted export")
    before = store.snapshot()
    not_promoted = {"promoted": False, "reason": "promote_if: never"}
    for run, decision in (("p2", promoted), ("p2", not_promoted), ("p1", not_promoted)):
        with pytest.raises(GrailError, match="a promoted export is never replaced"):
            export(model, None, dest, run_ids={"pipeline": run}, promotion=decision)
    assert store.snapshot() == before
    again = export(model, None, dest, run_ids={"pipeline": "p1"}, promotion=promoted)
    assert "model/model.safetensors" in again["uploaded"]


def test_a_promoted_export_whose_retry_was_killed_stays_promoted(store, model, monkeypatch):
    """The same run's retry removes manifest.json before its uploads; killed there, it left
    only manifest.pending.json, and another run's export replaced the champion's source
    (probe B9). The pending record says the export is a promoted one."""
    import grail.export.stage as stage

    dest = store.dest("exports", "r9")
    promoted = {"promoted": True, "reason": "promote_if: always"}
    export(model, None, dest, run_ids={"pipeline": "p1"}, promotion=promoted)
    (model / "model.safetensors").write_bytes(b"a retried model" * 300)

    def killed(*args, **kwargs):
        raise RuntimeError("killed mid-upload")

    with monkeypatch.context() as patch:
        patch.setattr(stage, "put", killed)
        with pytest.raises(RuntimeError, match="killed"):
            export(model, None, dest, run_ids={"pipeline": "p1"}, promotion=promoted)
    not_promoted = {"promoted": False, "reason": "promote_if: never"}
    with pytest.raises(GrailError, match="a promoted export is never replaced"):
        export(model, None, dest, run_ids={"pipeline": "p2"}, promotion=not_promoted)
    again = export(model, None, dest, run_ids={"pipeline": "p1"}, promotion=promoted)
    assert again["manifest"]["promoted"] is True
