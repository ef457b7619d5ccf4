"""A synthetic document study whose facts are known (``grail simulate --task summarize``).

Each document is about one fictional topic entity (a company or a town: no model can answer from
memory) and mixes three kinds of sentence:

- salient facts: 8-12 attributes of the topic entity, each in one sentence in varied wording;
- distractors: the same attributes of other fictional entities, drawn from the same value pools
  (a summary that keeps them, or lists every number, answers nothing);
- fluff: sentences with no fact at all.

Five hidden questions per document ask about the topic entity; about a fifth ask about an
attribute the document never states (RepLiQA's unanswerable share; the right answer is that the
document does not say). Every question carries what the deterministic reader needs
(:mod:`grail.tasks.summarize.reader`): the entity's names, the attribute's cue words, the answer
and its aliases. The oracle summary (the salient sentences) fits the stated budget, so the
ceiling is known: every answerable question answered.

The output is RepLiQA's own layout (one row per question: ``document_id``, ``document_topic``,
``document_extracted``, ``question_id``, ``question``, ``answer``, ...) plus those reader
columns, so ``grail clean --task summarize`` reads the synthetic study and the real one alike.

Run: ``grail simulate --task summarize --out raw [--documents 600]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grail.core.errors import GrailError

# RepLiQA's `answer` to a question the document cannot answer (its dataset card); its
# `long_answer` then reads LONG_UNANSWERABLE, which grail before 2026-11-27 wrote as the answer.
UNANSWERABLE = "UNANSWERABLE"
LONG_UNANSWERABLE = "The answer is not found in the document."
QUESTIONS_PER_DOCUMENT = 5
UNANSWERABLE_SHARE = 0.2
SALIENT = (8, 12)  # facts about the topic entity per document, inclusive
DISTRACTORS = (5, 9)
FLUFF = (5, 9)

SYLLABLES = ("var", "nol", "the", "qui", "mar", "bre", "lin", "ost", "ern", "cal", "dra", "fen",
             "gor", "hal", "isk", "jor", "kel", "lum", "mir", "nax", "pel", "ros", "sar", "tov",
             "ul", "vek", "wen", "yar", "zol", "ard", "bel", "cor")  # fmt: skip
GIVEN = ("Mara", "Tobin", "Ilse", "Corwin", "Anouk", "Bastian", "Elodie", "Rasmus", "Signe",
         "Teodor", "Liesel", "Oren", "Petra", "Jarek", "Nadia", "Quentin")  # fmt: skip
PRODUCTS = ("water pumps", "bicycle frames", "ceramic tiles", "weather sensors", "rope",
            "canned fish", "glass lenses", "wool blankets", "solar lamps", "paper")  # fmt: skip
CROPS = ("barley", "apples", "hops", "flax", "rye", "plums", "beets", "oats")
INDUSTRIES = ("shipbuilding", "textiles", "printing", "brewing", "mining", "pottery")


@dataclass(frozen=True)
class Attribute:
    """One fact a document can state: the question that asks it, the words a sentence stating
    it must use (`cues`, regular expressions), ways to state it ({entity}, {value}), and the
    value pool it draws from."""

    name: str
    question: str
    cues: tuple[str, ...]
    statements: tuple[str, ...]
    pool: str


def attr(name, question, cues, statements, pool) -> Attribute:
    return Attribute(name, question, tuple(cues), tuple(statements), pool)


COMPANY = (
    attr("founded", "In what year was {entity} founded?", [r"founded in", r"establish"],
         ["{entity} was founded in {value}.", "Since it was established in {value}, "
          "{entity} has changed hands twice."], "year"),
    attr("founder", "Who founded {entity}?", [r"founded by", r"founder"],
         ["{entity} was founded by {value}.", "{value}, the founder of {entity}, still sits "
          "on its board."], "person"),
    attr("headquarters", "Where is {entity} headquartered?", [r"headquarter", r"based in"],
         ["{entity} is headquartered in {value}.", "{entity} is based in {value}, near the "
          "old rail yard."], "town"),
    attr("employees", "How many people does {entity} employ?", [r"employ", r"staff"],
         ["{entity} employs {value} people.", "A staff of {value} keeps {entity} running."],
         "count"),
    attr("product", "What does {entity} make?", [r"\bmakes?\b", r"produc", r"manufactur"],
         ["{entity} makes {value}.", "Most of what {entity} produces is {value}."], "product"),
    attr("revenue", "What was {entity}'s revenue last year?", [r"revenue", r"turnover"],
         ["Last year {entity} reported revenue of {value}.", "{entity} had a turnover of "
          "{value} last year."], "money"),
    attr("chief", "Who leads {entity} as chief executive?", [r"chief executive", r"\bled by"],
         ["{entity} is led by chief executive {value}.", "{value} became chief executive of "
          "{entity} after a long search."], "person"),
    attr("factories", "How many factories does {entity} run?", [r"factor"],
         ["{entity} runs {value} factories.", "Across the region, {entity} operates {value} "
          "factories."], "small"),
    attr("export", "To how many countries does {entity} export?", [r"export"],
         ["{entity} exports to {value} countries.", "Goods from {entity} are exported to "
          "{value} countries."], "small"),
    attr("motto", "What is {entity}'s motto?", [r"motto"],
         ["The motto of {entity} is '{value}'.", "{entity} prints its motto, '{value}', on "
          "every crate."], "motto"),
    attr("rival", "Which firm is {entity}'s main rival?", [r"rival", r"compet"],
         ["{entity}'s main rival is {value}.", "{entity} competes most closely with "
          "{value}."], "firm"),
    attr("patents", "How many patents does {entity} hold?", [r"patent"],
         ["{entity} holds {value} patents.", "Engineers at {entity} have filed {value} "
          "patents."], "count"),
    attr("warehouse", "Where is {entity}'s largest warehouse?", [r"warehouse"],
         ["{entity}'s largest warehouse is in {value}.", "The biggest warehouse of {entity} "
          "stands in {value}."], "town"),
)  # fmt: skip

TOWN = (
    attr("population", "What is the population of {entity}?", [r"population", r"inhabit"],
         ["{entity} has a population of {value}.", "Some {value} inhabitants live in "
          "{entity}."], "count"),
    attr("mayor", "Who is the mayor of {entity}?", [r"mayor"],
         ["The mayor of {entity} is {value}.", "{value} was elected mayor of {entity}."],
         "person"),
    attr("river", "Which river runs through {entity}?", [r"river"],
         ["The {value} river runs through {entity}.", "{entity} grew up along the banks of "
          "the {value} river."], "river"),
    attr("chartered", "In what year did {entity} receive its charter?", [r"charter"],
         ["{entity} received its town charter in {value}.", "The charter of {entity} dates "
          "from {value}."], "year"),
    attr("crop", "What is the main crop grown around {entity}?", [r"crop", r"grow"],
         ["The main crop around {entity} is {value}.", "Farmers around {entity} mostly grow "
          "{value}."], "crop"),
    attr("festival", "What festival is {entity} known for?", [r"festival"],
         ["{entity} is known for its {value} festival.", "Every summer {entity} holds the "
          "{value} festival."], "festival"),
    attr("twin", "Which town is {entity} twinned with?", [r"twin"],
         ["{entity} is twinned with {value}.", "{entity} has been a twin town of {value} "
          "for decades."], "town"),
    attr("bridges", "How many bridges does {entity} have?", [r"bridge"],
         ["{entity} has {value} bridges.", "{value} bridges cross the water in {entity}."],
         "small"),
    attr("industry", "What industry was {entity} built on?", [r"industr"],
         ["{entity} was built on the {value} industry.", "The {value} industry made "
          "{entity} rich."], "industry"),
    attr("elevation", "At what elevation does {entity} lie?", [r"elevation", r"above sea"],
         ["{entity} lies at an elevation of {value}.", "{entity} sits {value} above sea "
          "level."], "elevation"),
    attr("schools", "How many schools does {entity} have?", [r"school"],
         ["{entity} has {value} schools.", "Children in {entity} attend one of {value} "
          "schools."], "small"),
    attr("founder", "Who founded {entity}?", [r"founded by", r"who founded"],
         ["{entity} was founded by {value}.", "{value}, who founded {entity}, is buried in "
          "its square."], "person"),
    attr("museum", "What is the name of {entity}'s museum?", [r"museum"],
         ["The museum of {entity} is called {value}.", "Visitors to {entity} often stop at "
          "{value}, its museum."], "museum"),
)  # fmt: skip

KINDS = {"company": COMPANY, "town": TOWN}
FLUFF_SENTENCES = (
    "Local opinion on the matter remains divided.",
    "Observers expect the coming years to bring further change.",
    "The region has a long history of trade and craft.",
    "Visitors often remark on the quiet streets and the old stone buildings.",
    "Much of this story began long before anyone wrote it down.",
    "Records from the early period are incomplete.",
    "Many residents say the place feels different every season.",
    "The weather in the area is mild for most of the year.",
    "Some of the older archives were lost in a flood.",
    "Newspapers in the region covered the developments at length.",
    "Not everyone agrees on what the future should look like.",
    "The surrounding countryside is known for its hiking trails.",
)
TOPICS = {"company": "Company Profiles", "town": "Local Places"}


def word(rng: np.random.Generator, parts: int) -> str:
    """A fictional word of `parts` syllables, capitalised."""
    return "".join(rng.choice(SYLLABLES, parts)).capitalize()


def entity_name(rng: np.random.Generator, kind: str) -> tuple[str, ...]:
    """A fictional entity's names, the full one first (a company's short name is its first
    word: the reader accepts either)."""
    if kind == "company":
        core = word(rng, 2)
        full = f"{core} {rng.choice(['Works', 'Industries', 'Instruments', 'Trading'])}"
        return (full, core)
    name = word(rng, 3)
    return (name,)


def value(rng: np.random.Generator, pool: str) -> tuple[str, ...]:
    """A value from `pool` and its aliases (the first is how documents write it)."""
    if pool == "year":
        return (str(int(rng.integers(1850, 2016))),)
    if pool == "person":
        surname = word(rng, 2)
        return (f"{rng.choice(GIVEN)} {surname}", surname)
    if pool in ("town", "river"):
        return (word(rng, 3),)
    if pool == "firm":
        core = word(rng, 2)
        return (f"{core} Holdings", core)
    if pool == "count":
        n = int(rng.integers(120, 9800))
        return (f"{n:,}", str(n))
    if pool == "small":
        return (str(int(rng.integers(3, 40))),)
    if pool == "money":
        amount = f"{rng.integers(2, 90)}.{rng.integers(1, 10)}"
        return (f"{amount} million crowns", f"{amount} million")
    if pool == "motto":
        return (f"{rng.choice(['Steady', 'Honest', 'Bright', 'Patient'])} hands, "
                f"{rng.choice(['open', 'full', 'clear', 'calm'])} doors",)  # fmt: skip
    if pool == "product":
        return (str(rng.choice(PRODUCTS)),)
    if pool == "crop":
        return (str(rng.choice(CROPS)),)
    if pool == "industry":
        return (str(rng.choice(INDUSTRIES)),)
    if pool == "festival":
        return (f"{word(rng, 2)} Lantern",)
    if pool == "elevation":
        metres = int(rng.integers(40, 2400))
        return (f"{metres} metres", f"{metres} m")
    if pool == "museum":
        core = word(rng, 2)
        return (f"the {core} House", f"{core} House")
    raise ValueError(f"unknown value pool {pool!r}")


def state(rng: np.random.Generator, attribute: Attribute, names: tuple, answer: tuple) -> str:
    """One sentence stating `attribute` of the entity `names` (by either of its names)."""
    template = attribute.statements[int(rng.integers(len(attribute.statements)))]
    return template.format(entity=names[int(rng.integers(len(names)))], value=answer[0])


def count(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def make_document(rng: np.random.Generator, number: int) -> dict:
    """One document: its sentences in order, which are salient, and its five questions."""
    kind = str(rng.choice(list(KINDS)))
    attributes = KINDS[kind]
    topic = entity_name(rng, kind)
    order = rng.permutation(len(attributes))
    stated = [attributes[i] for i in order[: count(rng, SALIENT)]]
    missing = [attributes[i] for i in order[len(stated) :]]
    facts = {a.name: value(rng, a.pool) for a in stated}
    salient = [state(rng, a, topic, facts[a.name]) for a in stated]
    others = []
    while len(others) < 3:  # other entities never share a name with the topic
        other = entity_name(rng, kind)
        if not set(other) & set(topic):
            others.append(other)
    distractors = [
        state(rng, a, others[int(rng.integers(len(others)))], value(rng, a.pool))
        for a in rng.choice(attributes, count(rng, DISTRACTORS))
    ]
    fluff = list(rng.choice(FLUFF_SENTENCES, count(rng, FLUFF), replace=False))
    body = [("salient", s) for s in salient[1:]] + [("distractor", s) for s in distractors]
    body += [("fluff", s) for s in fluff]
    body = [body[i] for i in rng.permutation(len(body))]
    sentences = [("salient", salient[0])] + body  # the first sentence introduces the entity
    unanswerable = rng.random(QUESTIONS_PER_DOCUMENT) < UNANSWERABLE_SHARE
    asked = list(rng.choice(len(stated), QUESTIONS_PER_DOCUMENT, replace=False))
    questions = []
    for k, (no_answer, index) in enumerate(zip(unanswerable, asked, strict=True)):
        a = missing[k % len(missing)] if no_answer and missing else stated[index]
        answer = facts.get(a.name)
        questions.append(
            {
                "question_id": f"doc{number:05d}-q{k + 1}",
                "question": a.question.format(entity=topic[0]),
                "answer": answer[0] if answer else UNANSWERABLE,
                "answer_aliases": list(answer or ()),
                "entity_aliases": list(topic),
                "cues": list(a.cues),
                "attribute": a.name,
            }
        )
    return {
        "document_id": f"doc{number:05d}",
        "document_topic": TOPICS[kind],
        "entity": topic[0],
        "sentences": [s for _, s in sentences],
        "roles": [role for role, _ in sentences],
        "questions": questions,
    }


def is_unanswerable(answer: str) -> bool:
    """Whether a RepLiQA `answer` says the document does not answer the question: the card's
    literal (any case), or the long form an earlier grail study wrote.

    >>> is_unanswerable("UNANSWERABLE"), is_unanswerable(" unanswerable "), is_unanswerable("12")
    (True, True, False)
    """
    return answer.strip().upper() == UNANSWERABLE or answer.strip() == LONG_UNANSWERABLE


def simulate_documents(out: str | Path, documents: int = 600, seed: int = 7) -> dict:
    """Write `documents` synthetic documents in RepLiQA's layout (``repliqa.jsonl``, one line per
    question) and ``truth.json`` (each document's sentence roles) under `out`; returns the truth.
    Same seed, same bytes. `out` is written whole, and only if it is empty or an earlier
    output of this command (:func:`grail.core.outputs.atomic_folder`): never over a real
    ``repliqa.jsonl``."""
    from grail.core.outputs import atomic_folder

    with atomic_folder(out, "simulate --task summarize") as staging:
        return _simulate_documents(staging, documents, seed)


def _simulate_documents(out: Path, documents: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    made = [make_document(rng, n) for n in range(documents)]
    with (out / "repliqa.jsonl").open("w") as f:
        for doc in made:
            text = " ".join(doc["sentences"])
            for q in doc["questions"]:
                row = {
                    "document_id": doc["document_id"],
                    "document_topic": doc["document_topic"],
                    "document_path": f"synthetic/{doc['document_id']}.pdf",
                    "document_extracted": text,
                    "question_id": q["question_id"],
                    "question": q["question"],
                    "answer": q["answer"],
                    "long_answer": q["answer"] if q["answer_aliases"] else LONG_UNANSWERABLE,
                } | {key: q[key] for key in ("answer_aliases", "entity_aliases", "cues")}
                f.write(json.dumps(row) + "\n")
    truth = {
        "documents": documents,
        "seed": seed,
        "roles": {doc["document_id"]: doc["roles"] for doc in made},
        "entities": {doc["document_id"]: doc["entity"] for doc in made},
    }
    (out / "truth.json").write_text(json.dumps(truth) + "\n")
    return truth


DEFAULT_DOCUMENTS = 300  # the summarize DAG's synthetic study when `documents` is 0


def write_study(
    out: str | Path,
    participants: int | None,
    documents: int,
    seed: int,
    layout: str,
    choices: str = "study",
) -> list[str]:
    """``grail simulate --task summarize``: `documents` synthetic documents in RepLiQA's layout
    (`participants` is the other task's; the capsule's layout and the choices' rungs are the
    slate study's alone)."""
    if layout != "grail":
        raise GrailError("layout: the summarize task writes RepLiQA's layout only")
    if choices != "study":
        raise GrailError("choices: the summarize task's study has no people choosing")
    documents = documents or DEFAULT_DOCUMENTS  # 0 (the DAG's default): the default size
    simulate_documents(out, documents=documents, seed=seed)
    return [f"wrote {documents} synthetic documents to {out} (RepLiQA's layout)"]
