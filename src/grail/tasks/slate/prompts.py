"""Prompt builder: a contract row -> the system prompt and the user prompt the viewer model reads.

Run: ``grail prompt data/ --row 3 [--history-depth 12] [--show-ids] [--shuffle-seed S]``
(:class:`PromptOptions`: every field is an option).

User prompt sections, in order, a blank line between blocks: ``VIEWER`` (one line of profile
fragments), ``Initial Viewpoint:`` (when known), ``CURRENTLY WATCHING``, ``RECENTLY WATCHED (NEWEST
LAST)``, ``SURVEY HIGHLIGHTS`` (omitted when empty) and ``OPTIONS``. Every option is rendered with
the same fields in the same format, whether the value is known or not, so nothing but the
content can single out the clicked one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from grail.core.config import option
from grail.core.errors import GrailError
from grail.inference.answers import option_token_ids as option_token_ids  # its name here too
from grail.tasks.slate.policy_issues import ISSUES

SYSTEM_PROMPT = (
    "You simulate a specific YouTube viewer taking part in a study. Given who they are, what they "
    "are watching and what they watched before, predict which of the OPTIONS they click next. "
    "Think briefly inside <think></think>, then give only the option number inside "
    "<answer></answer>."
)
OPINION_INSTRUCTION = (
    " Then say whether their opinion on the issue will increase, decrease or show no change after "
    "the session, as <opinion>increase|decrease|no_change</opinion>."
)
PROFILE_FIELDS = (
    ("age", "age {}"),
    ("gender", "{}"),
    ("race", "{}"),
    ("income", "income {}"),
    ("pid1", "party {}"),
    ("pid2", "{} partisan"),
    ("ideo1", "ideology {}"),
    ("freq_youtube", "YouTube {}"),
    ("college", "college degree: {}"),
    ("pol_interest", "politics: {}"),
    ("religpew", "religion: {}"),
    ("newsint", "follows news {}"),
)
HIGHLIGHT_FIELDS = (
    ("gun_own", "owns a gun: {}"),
    ("stricter_laws", "stricter gun laws: {}"),
    ("assault_ban", "assault weapons ban: {}"),
    ("handgun_ban", "handgun ban: {}"),
    ("concealed_safe", "concealed carry makes us safer: {}"),
    ("gun_importance", "gun policy importance: {}"),
    ("gun_enthusiasm", "enthusiasm about guns: {}"),
    ("minwage15", "$15 minimum wage: {}"),
    ("mw_support", "raising the minimum wage: {}"),
)


@dataclass
class PromptOptions:
    """How a row is asked: the same fields in training recipes (``TrainConfig`` extends this),
    ``grail prompt``, ``grail generate`` and ``grail benchmark``."""

    history_depth: int = option("Most recent watched videos shown in the prompt; 0 = all.", 12)
    show_ids: bool = option("Show video ids in the prompt.", False)
    shuffle_seed: int | None = option(
        "Shuffle the options with this seed (gold index remapped); unset keeps the displayed "
        "order.",
        None,
    )
    opinion: bool = option(
        "Also ask for the opinion direction (<opinion> tag). Formerly opinion_task.",
        False,
        aliases=["--opinion_task", "--opinion-task"],
    )
    system_prompt: str | None = option(
        "System prompt; default grail.tasks.slate.prompts.SYSTEM_PROMPT (plus the opinion "
        "instruction).",
        None,
    )

    def __post_init__(self):
        if self.history_depth < 0:
            raise GrailError(f"history_depth must be 0 (all) or more, got {self.history_depth}")


def _count(value: int | None, unit: str) -> str:
    """Compact counts, identical format for every option.

    >>> _count(1234567, "views"), _count(950, "likes"), _count(None, "comments")
    ('1.2M views', '950 likes', '? comments')
    """
    if value is None:
        return f"? {unit}"
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.1f}{suffix} {unit}"
    return f"{value} {unit}"


def _clock(seconds: float | None) -> str:
    """Seconds as m:ss.

    >>> _clock(754), _clock(None)
    ('12:34', '?:??')
    """
    if seconds is None:
        return "?:??"
    minutes, sec = divmod(int(round(seconds)), 60)
    return f"{minutes}:{sec:02d}"


def _video(item: dict, show_ids: bool) -> str:
    prefix = f"[{item.get('id')}] " if show_ids else ""
    title = item.get("title") or "(untitled)"
    return f"{prefix}{title} (from {item.get('channel') or 'unknown channel'})"


def render_option(number: int, item: dict, show_ids: bool = False) -> str:
    """One OPTIONS line: every option has the same fields, unknown values shown as ``?``.

    >>> render_option(2, {"id": "x", "title": "T", "channel": "C", "duration_seconds": 75,
    ...                   "views": 1500, "likes": None, "comments": 3})
    '2. T (from C) | 1:15 | 1.5k views | ? likes | 3 comments'
    """
    return " | ".join(
        [
            f"{number}. {_video(item, show_ids)}",
            _clock(item.get("duration_seconds")),
            _count(item.get("views"), "views"),
            _count(item.get("likes"), "likes"),
            _count(item.get("comments"), "comments"),
        ]
    )


def _fragments(viewer: dict | None, fields) -> list[str]:
    viewer = viewer or {}
    return [template.format(viewer[name]) for name, template in fields if viewer.get(name)]


def shuffle_slate(row: dict, seed: int) -> dict:
    """The row with its slate in a seeded order and ``gold_index`` remapped (same seed, same order).

    >>> row = {"session_id": "s", "step_index": 0, "gold_index": 1, "n_options": 3,
    ...        "slate": [{"id": "a"}, {"id": "b"}, {"id": "c"}], "gold_id": "a"}
    >>> new = shuffle_slate(row, seed=3)
    >>> new["slate"][new["gold_index"] - 1]["id"]
    'a'
    """
    key = f"{seed}:{row.get('session_id')}:{row.get('step_index')}".encode()
    order = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8])).permutation(
        len(row["slate"])
    )
    slate = [row["slate"][i] for i in order]
    return row | {
        "slate": slate,
        "gold_index": int(np.flatnonzero(order == row["gold_index"] - 1)[0]) + 1,
    }


def build_user_prompt(row: dict, options: PromptOptions | None = None) -> str:
    """The user prompt for one step (a contract row as a dict); see the module docstring.

    The slate is rendered in the row's order: use :func:`to_example` to apply the option shuffle.
    """
    options = options or PromptOptions()
    blocks = [
        "VIEWER\n"
        + ("; ".join(_fragments(row.get("viewer"), PROFILE_FIELDS)) or "no profile information")
    ]
    if row.get("opinion_before") is not None:
        issue = row.get("issue", "")
        known = ISSUES.get(issue)
        about = f"{known.label} ({known.scale})" if known else f"{issue} (0 to 1)"
        blocks.append(f"Initial Viewpoint: {row['opinion_before']:.2f} on {about}")
    current = row.get("current_video") or {}
    blocks.append(f"CURRENTLY WATCHING {_video(current, options.show_ids)}")
    history = list(row.get("history") or [])
    if options.history_depth:
        history = history[-options.history_depth :]
    watched = [
        f"{k}. {_video(item, options.show_ids)} | watched {_clock(item.get('watch_seconds'))} "
        f"of {_clock(item.get('total_seconds'))}"
        for k, item in enumerate(history, start=1)
    ]
    blocks.append("RECENTLY WATCHED (NEWEST LAST)\n" + ("\n".join(watched) or "(none)"))
    highlights = _fragments(row.get("viewer"), HIGHLIGHT_FIELDS)
    if highlights:
        sentence = "; ".join(highlights)
        blocks.append(f"SURVEY HIGHLIGHTS\n{sentence[:1].upper()}{sentence[1:]}.")
    blocks.append(
        "OPTIONS\n"
        + "\n".join(
            render_option(k, item, options.show_ids) for k, item in enumerate(row["slate"], start=1)
        )
    )
    return "\n\n".join(blocks)


def system_prompt(options: PromptOptions | None = None) -> str:
    options = options or PromptOptions()
    if options.system_prompt:
        return options.system_prompt
    return SYSTEM_PROMPT + (OPINION_INSTRUCTION if options.opinion else "")


def build_messages(row: dict, options: PromptOptions | None = None) -> list[dict[str, str]]:
    """Conversational prompt (TRL's format): a system and a user message."""
    options = options or PromptOptions()
    return [
        {"role": "system", "content": system_prompt(options)},
        {"role": "user", "content": build_user_prompt(row, options)},
    ]


def to_example(row: dict, options: PromptOptions | None = None) -> dict:
    """A training/evaluation example: the conversational prompt and the (shuffled) labels.

    >>> row = {"slate": [{"id": "a", "title": "A"}, {"id": "b", "title": "B"}], "gold_index": 2,
    ...        "gold_id": "b", "n_options": 2, "issue": "gun_control"}
    >>> example = to_example(row, PromptOptions(shuffle_seed=0))
    >>> sorted(example), example["gold_index"] in (1, 2)
    (['gold_id', 'gold_index', 'n_options', 'opinion_direction', 'prompt'], True)
    """
    options = options or PromptOptions()
    if options.shuffle_seed is not None:
        row = shuffle_slate(row, options.shuffle_seed)
    return {
        "prompt": build_messages(row, options),
        "gold_index": row["gold_index"],
        "gold_id": row["gold_id"],
        "n_options": row["n_options"],
        "opinion_direction": row.get("opinion_direction"),
    }
