"""The model reader and judge: RepLiQA's questions, which the deterministic reader cannot score.

An OpenAI-compatible reader (``openai:NAME@URL``: a vLLM server in the cluster, or
``openai:NAME``: an API model) answers each hidden question from the summary alone. Its answer
is matched against the gold one first, for free: after SQuAD's normalisation (case,
punctuation, articles), an exact match or a token F1 of at least :data:`F1_MATCH` is right, and
"not found" against an answerable question (or a value against an unanswerable one) is wrong.
Only the rest go to the judge, asked whether the two answers agree. Without a judge the rest are
wrong, and the report says the verdicts came from matching alone.

A request that keeps failing after the client's retries, or a judge reply that is neither yes
nor no, is a missing verdict (None): counted and reported, never a silent 0 (Summary-RL scored
a failed call as 0).
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from grail.core.errors import GrailError
from grail.core.serving import first_request, openai_client, openai_spec

logger = logging.getLogger(__name__)

F1_MATCH = 0.8  # token F1 at which an answer counts as the gold one without asking the judge
NOT_FOUND = "NOT FOUND"
READER_PROMPT = (
    "Answer the question from the summary alone. Reply with the answer only, as short as "
    f"possible. If the summary does not say, reply exactly: {NOT_FOUND}\n\n"
    "SUMMARY\n{summary}\n\nQUESTION\n{question}"
)
JUDGE_PROMPT = (
    "A question, its correct answer and a candidate answer follow. Does the candidate give "
    "the correct answer (other wording is fine, a different value is not)? Reply yes or no.\n\n"
    "QUESTION\n{question}\n\nCORRECT ANSWER\n{gold}\n\nCANDIDATE ANSWER\n{candidate}"
)
# Summary-RL's judge sees the document the question is about: with it, an answer that words
# the document's fact differently from the gold answer can be judged (the reader never sees it).
JUDGE_DOCUMENT = "\n\nTHE DOCUMENT THE QUESTION IS ABOUT\n{document}"


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces.

    >>> normalize("The  Varnol Works, Inc.")
    'varnol works inc'
    """
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def token_f1(candidate: str, gold: str) -> float:
    """SQuAD's token F1 of two normalised answers.

    >>> round(token_f1("about 1,204 workers", "1,204 workers"), 3)
    0.8
    """
    mine, theirs = normalize(candidate).split(), normalize(gold).split()
    common = sum((Counter(mine) & Counter(theirs)).values())
    if not common:
        return 0.0
    precision, recall = common / len(mine), common / len(theirs)
    return 2 * precision * recall / (precision + recall)


def says_not_found(reply: str) -> bool:
    """Whether the reader said the summary does not answer.

    >>> says_not_found("NOT FOUND."), says_not_found("It is not found here"), says_not_found("12")
    (True, True, False)
    """
    return normalize(NOT_FOUND) in normalize(reply)


def matched(reply: str, question: dict) -> bool | None:
    """The verdict matching gives (True or False), or None when only the judge can tell.

    >>> q = {"answer": "1,204", "answerable": True}
    >>> matched("1,204", q), matched("NOT FOUND", q), matched("about nine hundred", q)
    (True, False, None)
    >>> matched("NOT FOUND", {"answer": "UNANSWERABLE", "answerable": False})
    True
    """
    if not question["answerable"]:
        return says_not_found(reply)
    if says_not_found(reply):
        return False
    if normalize(reply) == normalize(question["answer"]):
        return True
    return True if token_f1(reply, question["answer"]) >= F1_MATCH else None


def judge_verdict(reply: str | None) -> bool | None:
    """The judge's yes or no; None for anything else.

    >>> judge_verdict("Yes."), judge_verdict("no"), judge_verdict("maybe"), judge_verdict(None)
    (True, False, None, None)
    """
    words = normalize(reply or "").split()
    if not words or words[0] not in ("yes", "no"):
        return None
    return words[0] == "yes"


@dataclass
class ReadingCounts:
    """What reading cost and where it failed, for the report."""

    questions: int = 0
    matched: int = 0
    judged: int = 0
    reader_failed: int = 0
    judge_failed: int = 0
    unmatched_without_judge: int = 0

    def add(self, other: ReadingCounts) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class ModelReader:
    """A reader (and optionally a judge) behind OpenAI-compatible endpoints."""

    reader: str
    judge: str | None = None
    concurrency: int = 8
    retries: int = 4
    timeout: float = 60.0
    max_tokens: int = 64
    counts: ReadingCounts = field(default_factory=ReadingCounts)

    def __post_init__(self):
        self._reader = openai_spec(self.reader)
        self._judge = openai_spec(self.judge) if self.judge else None

    def record(self) -> dict:
        """The reader and judge as the recipe names them, and what reading cost."""
        return {
            "reader": self.reader,
            "judge": self.judge,
            "f1_match": F1_MATCH,
            "counts": vars(self.counts),
        }

    def _ask(self, spec, prompt: str) -> str | None:
        import openai

        client = openai_client(spec, self.retries, self.timeout)
        try:
            reply = client.chat.completions.create(
                model=spec.model,
                messages=[{"role": "user", "content": prompt}],
                temperature=0,
                max_tokens=self.max_tokens,
            )
        except openai.APIConnectionError as err:
            logger.warning("%s: %s", spec.name, err)
            return None
        except openai.OpenAIError as err:  # after the client's retries: missing, not 0
            logger.warning("%s: request failed after %d retries: %s", spec.name, self.retries, err)
            return None
        return reply.choices[0].message.content or ""

    def probe(self) -> None:
        """Fail at once, in one line, when the reader or the judge cannot be reached or
        refuses the model: one one-token request each, before anything is read (a server's
        model list is no test: ``transformers serve`` answers /v1/models with 500 offline)."""
        for spec in filter(None, (self._reader, self._judge)):
            client = openai_client(spec, 1, self.timeout)
            first_request(
                spec,
                lambda spec=spec, client=client: client.chat.completions.create(
                    model=spec.model,
                    messages=[{"role": "user", "content": "Reply OK."}],
                    max_tokens=1,
                ),
            )

    def verdict(
        self, summary: str, question: dict, counts: ReadingCounts, document: str | None = None
    ) -> bool | None:
        """One question read from one summary: True, False or None (missing); the judge, when
        asked, also sees the `document`."""
        counts.questions += 1
        reply = self._ask(
            self._reader, READER_PROMPT.format(summary=summary, question=question["question"])
        )
        if reply is None:
            counts.reader_failed += 1
            return None
        verdict = matched(reply, question)
        if verdict is not None:
            counts.matched += 1
            return verdict
        if self._judge is None:
            counts.unmatched_without_judge += 1
            return False
        counts.judged += 1
        verdict = judge_verdict(
            self._ask(
                self._judge,
                JUDGE_PROMPT.format(
                    question=question["question"], gold=question["answer"], candidate=reply
                )
                + (JUDGE_DOCUMENT.format(document=document) if document else ""),
            )
        )
        if verdict is None:
            counts.judge_failed += 1
        return verdict

    def read(
        self,
        summaries: list[str | None],
        questions: list[list[dict]],
        documents: list[str] | None = None,
    ) -> list[list]:
        """Verdicts for every question of every summary (a None summary answers nothing); the
        judge sees each summary's document when `documents` are given."""
        texts = documents or [None] * len(summaries)
        jobs = [
            (k, j, summary, q, text)
            for k, (summary, asked, text) in enumerate(
                zip(summaries, questions, texts, strict=True)
            )
            if summary is not None
            for j, q in enumerate(asked)
        ]
        verdicts = [[False] * len(asked) for asked in questions]
        counts = [ReadingCounts() for _ in jobs]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            found = pool.map(
                lambda n: self.verdict(jobs[n][2], jobs[n][3], counts[n], jobs[n][4]),
                range(len(jobs)),
            )
            for (k, j, *_), verdict in zip(jobs, found, strict=True):
                verdicts[k][j] = verdict
        for c in counts:
            self.counts.add(c)
        return verdicts


SPEC = re.compile(r"^openai:[^@\s]+(@\S+)?$")


def check_reader_spec(value: str | None, name: str) -> None:
    """One line for a reader or judge that is not an ``openai:NAME[@URL]`` spec."""
    if value and not SPEC.match(value):
        raise GrailError(f"{name}: expected openai:NAME or openai:NAME@URL, got {value!r}")
