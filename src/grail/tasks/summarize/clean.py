"""RepLiQA's layout -> one row per document with its hidden questions, split by document
(``grail clean --task summarize``).

Input: RepLiQA as published (``hf:ServiceNow/repliqa`` through ``datasets``, split ``repliqa_0``
by default) or files in its layout (a ``.jsonl``/``.parquet`` file or a folder of them), one row
per question: ``document_id``, ``document_topic``, ``document_extracted``, ``question_id``,
``question``, ``answer`` (``long_answer`` and ``document_path`` are kept out). The synthetic
study adds the deterministic reader's columns (``answer_aliases``, ``entity_aliases``, ``cues``);
RepLiQA has none, so its questions go to a model reader.

The split is Summary-RL's: documents shuffled with seed 80, the first 91 for validation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from grail.core.errors import GrailError
from grail.core.outputs import atomic_folder, check_complete, check_listed, work_folder
from grail.tasks.summarize.documents import is_unanswerable
from grail.tasks.summarize.reader import split_sentences

REQUIRED = ("document_id", "document_extracted", "question_id", "question", "answer")
READER = ("answer_aliases", "entity_aliases", "cues")


def load_rows(raw: str, split: str = "repliqa_0") -> tuple[list[dict], str]:
    """RepLiQA's rows and the name to cite in errors: ``hf:NAME`` through the hub, else a
    file or folder in its layout read by ``datasets`` (json lines or parquet)."""
    import datasets

    if raw.startswith("hf:"):
        try:
            return datasets.load_dataset(raw[3:], split=split).to_list(), raw
        except OSError as err:  # ConnectionError offline; a missing dataset or split
            cause = (str(err).splitlines() or [type(err).__name__])[0]
            raise GrailError(
                f"{raw}: not readable from the Hugging Face Hub ({cause}); offline, fetch "
                f"RepLiQA's parquet file (data/{split}-00000-of-00001.parquet) where the Hub "
                "answers and pass its path as raw"
            ) from None
    path = Path(raw)
    files = [path] if path.is_file() else sorted(
        p for p in path.glob("*") if p.suffix in (".jsonl", ".parquet")
    )  # fmt: skip
    if not files:
        raise GrailError(f"{raw}: no .jsonl or .parquet file in RepLiQA's layout")
    kinds = {"parquet" if f.suffix == ".parquet" else "json" for f in files}
    if len(kinds) > 1:
        raise GrailError(f"{raw}: both json lines and parquet files; keep one kind")
    for file in files:
        check_file(file)
    check_same_schema(files)
    source = str(files[0] if len(files) == 1 else path)
    with work_folder("repliqa") as cache:  # no cache left behind
        try:
            table = datasets.load_dataset(
                kinds.pop(), data_files=[str(f) for f in files], split="train", cache_dir=str(cache)
            )
        except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as err:
            cause = (str(err.__cause__ or err).splitlines() or [type(err).__name__])[0]
            raise GrailError(f"{source}: not readable in RepLiQA's layout ({cause})") from None
        return table.to_list(), source


MAX_DOCUMENT_CHARACTERS = 200_000  # RepLiQA's longest is ~20,000; a 19 MB one asked for 382 GB


def check_file(path: Path) -> None:
    """One line for a file that cannot hold RepLiQA's rows: empty, or json lines that are not
    UTF-8 (naming the line and byte) or not one JSON object per line."""
    if path.stat().st_size == 0:
        raise GrailError(f"{path}: empty (no rows)")
    if path.suffix != ".jsonl":
        return
    with path.open("rb") as handle:
        for line, data in enumerate(handle, start=1):
            try:
                row = json.loads(data.decode("utf-8")) if data.strip() else {}
            except UnicodeDecodeError as err:
                raise GrailError(
                    f"{path}: line {line}: not UTF-8 (byte {err.start}: {data[err.start]:#04x}); "
                    "json lines must be UTF-8"
                ) from None
            except json.JSONDecodeError as err:
                raise GrailError(f"{path}: line {line}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise GrailError(f"{path}: line {line}: not a JSON object (one row per line)")


def check_same_schema(files: list[Path]) -> None:
    """Parquet files read as one table must have the same columns of the same types: datasets
    casts one to the other's otherwise (a number column read as text, silently)."""
    import pyarrow.parquet as pq

    parquet = [f for f in files if f.suffix == ".parquet"]
    if len(parquet) < 2:
        return
    try:
        first = pq.read_schema(parquet[0])
        for other in parquet[1:]:
            schema = pq.read_schema(other)
            if schema.remove_metadata() != first.remove_metadata():
                own = {f.name: str(f.type) for f in schema}
                theirs = {f.name: str(f.type) for f in first}
                names = sorted(set(own) ^ set(theirs)) or sorted(
                    n for n in own if own[n] != theirs.get(n)
                )
                raise GrailError(
                    f"{other}: its columns differ from {parquet[0].name}'s (first: "
                    f"{names[0]}: {own.get(names[0], 'missing')} here, "
                    f"{theirs.get(names[0], 'missing')} there); give files of one schema"
                )
    except OSError as err:  # pyarrow's error for a file that is not parquet
        raise GrailError(f"{err}".splitlines()[0]) from None


def check_row(row: dict, number: int, source: str) -> None:
    """One line naming the file, row and field for a row the contract cannot hold."""
    for field in REQUIRED:
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise GrailError(f"{source}: row {number}: {field} is missing or empty")
    if len(row["document_extracted"]) > MAX_DOCUMENT_CHARACTERS:
        raise GrailError(
            f"{source}: row {number}: document_extracted has {len(row['document_extracted']):,} "
            f"characters, more than the {MAX_DOCUMENT_CHARACTERS:,} a document may have "
            "(docs/tasks.md)"
        )
    for field in READER:
        value = row.get(field)
        if value is None:
            continue
        if not isinstance(value, list):
            raise GrailError(f"{source}: row {number}: {field} is not a list")
        bad = [v for v in value if not isinstance(v, str) or not v.strip()]
        if bad:
            wrong = bad[0]
            raise GrailError(
                f"{source}: row {number}: {field} holds {wrong!r}; expected a list of "
                "non-empty strings"
            )


def documents_from(rows: list[dict], source: str) -> list[dict]:
    """Questions grouped under their document, in first-seen order."""
    documents: dict[str, dict] = {}
    ids_of_text: dict[str, str] = {}
    first_row: dict[str, int] = {}  # question_id -> the row that first gave it
    for number, row in enumerate(rows):
        check_row(row, number, source)
        seen = first_row.setdefault(row["question_id"], number)
        if seen != number:  # one question counted twice, or two questions under one id
            raise GrailError(
                f"{source}: row {number}: question_id {row['question_id']!r} is row {seen}'s "
                "too; each question has an id of its own"
            )
        known = ids_of_text.setdefault(row["document_extracted"], row["document_id"])
        if known != row["document_id"]:
            raise GrailError(
                f"{source}: row {number}: document {row['document_id']} has the text of "
                f"document {known}: one text under two ids would sit in both splits"
            )
        doc = documents.setdefault(
            row["document_id"],
            {
                "document_id": row["document_id"],
                "document_topic": row.get("document_topic") or "",
                "text": row["document_extracted"],
                "questions": [],
            },
        )
        if doc["text"] != row["document_extracted"]:
            raise GrailError(
                f"{source}: row {number}: document_extracted differs from the earlier rows of "
                f"document {row['document_id']}"
            )
        answerable = not is_unanswerable(row["answer"])
        doc["questions"].append(
            {
                "question_id": row["question_id"],
                "question": row["question"],
                "answer": row["answer"],
                "answerable": answerable,
                "answer_aliases": list(row.get("answer_aliases") or ([row["answer"]] * answerable)),
                "entity_aliases": list(row.get("entity_aliases") or []),
                "cues": list(row.get("cues") or []),
            }
        )
    return list(documents.values())


def clean_documents(
    raw: str | Path,
    out: str | Path,
    validation_documents: int = 91,
    seed: int = 80,
    split: str = "repliqa_0",
) -> dict:
    """Write ``train.parquet`` and ``validation.parquet`` (one row per document) and
    ``audit.json`` under `out`; returns the audit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, source = load_rows(str(raw), split)
    documents = documents_from(rows, source)
    if not documents:
        raise GrailError(f"{source}: no rows")
    if validation_documents >= len(documents):
        raise GrailError(
            f"{source}: validation_documents is {validation_documents}, but there are only "
            f"{len(documents)} documents"
        )
    order = np.random.default_rng(seed).permutation(len(documents))
    for rank, index in enumerate(order):
        doc = documents[index]
        doc["split"] = "validation" if rank < validation_documents else "train"
        doc["sentences"] = split_sentences(doc["text"])
        doc["characters"] = len(doc["text"])
    with atomic_folder(out, "clean") as staging:  # complete or absent, never mixed
        for name in ("train", "validation"):
            kept = [documents[i] for i in order if documents[i]["split"] == name]
            pq.write_table(pa.Table.from_pylist(kept), staging / f"{name}.parquet")
        audit = audit_of(rows, documents, source, validation_documents, seed)
        (staging / "audit.json").write_text(json.dumps(audit, indent=1) + "\n")
        truth = Path(str(raw)) / "truth.json"
        if truth.is_file():  # the synthetic study's sentence roles
            shutil.copyfile(truth, staging / "truth.json")
    return audit


def audit_of(rows, documents, source, validation_documents, seed) -> dict:
    """What was read and kept, for audit.json."""
    questions = [q for d in documents for q in d["questions"]]
    audit = {
        "task": "summarize",
        "source": source,
        "rows": len(rows),
        "documents": len(documents),
        "validation_documents": validation_documents,
        "train_documents": len(documents) - validation_documents,
        "seed": seed,
        "questions": len(questions),
        "unanswerable_share": round(
            sum(not q["answerable"] for q in questions) / len(questions), 4
        ),
        "deterministic_reader": all(q["entity_aliases"] and q["cues"] for q in questions),
        "median_sentences": float(np.median([len(d["sentences"]) for d in documents])),
        "median_characters": float(np.median([d["characters"] for d in documents])),
    }
    return audit


def read_documents(
    data: str | Path, split: str, limit: int | None = None, model_reader: bool = False
) -> list[dict]:
    """The cleaned documents of `split` (a cleaned folder or one parquet file), the first
    `limit`; refused in one line when their questions lack the deterministic reader's fields
    (RepLiQA itself) and no `model_reader` will read them."""
    import pyarrow.parquet as pq

    path = Path(data) / f"{split}.parquet" if Path(data).is_dir() else Path(data)
    if not path.is_file():
        raise GrailError(f"{data}: no {split}.parquet (grail clean --task summarize writes it)")
    if Path(data).is_dir():
        check_complete(Path(data))  # a finished output, never a half-written or edited one
    check_listed(path)
    documents = pq.read_table(path).to_pylist()[:limit]
    if not documents:
        raise GrailError(f"{path}: no documents")
    if not model_reader and not all(
        q["entity_aliases"] and q["cues"] for d in documents for q in d["questions"]
    ):
        raise GrailError(
            f"{path}: questions without the deterministic reader's fields (RepLiQA itself): "
            "name a model reader (summary_reader: openai:NAME@URL, and summary_judge)"
        )
    return documents


def clean(raw: str | Path, out: str | Path, config) -> dict:
    """``grail clean --task summarize``: :func:`clean_documents` with the settings of `config`
    (:class:`grail.clean.config.CleanConfig`)."""
    return clean_documents(
        raw,
        out,
        validation_documents=config.validation_documents,
        seed=config.document_split_seed,
        split=config.repliqa_split,
    )


def cleaned(report: dict, out: str | Path) -> str:
    """What ``grail clean --task summarize`` prints: the audit, and the files it wrote."""
    return (
        json.dumps(report, indent=1)
        + f"\nwrote {out}/train.parquet, validation.parquet, audit.json"
    )


def audit_markdown(report: dict) -> str:
    """The audit as Markdown (:func:`grail.tasks.summarize.report.audit_markdown`)."""
    from grail.tasks.summarize.report import audit_markdown as markdown

    return markdown(report)


def audit_counts(report: dict) -> dict:
    """The counts the pipeline logs: rows, documents, validation documents."""
    return {k: report[k] for k in ("rows", "documents", "validation_documents")}


def clean_params(config, participants: int, documents: int) -> dict:
    """What the pipeline's clean run records: the study's size (documents) and the documents
    held out."""
    return {"synthetic": documents, "validation_documents": config.validation_documents}
