"""What GRAIL's discriminator (:mod:`grail.train.gail`) reads of a slate: the option a reply
chose, with its number, then the viewer and the slate it was chosen from (:func:`choice_text`),
and the feature discriminator's reading of that text (:func:`crossed_features`): the format
and its reader in one module."""

from __future__ import annotations

import re

from grail.tasks.slate.rewards import OPTIONS_HEADER, user_text


def choice_text(prompt, option: int, context: str = "slate") -> str | None:
    """Discriminator input: the chosen option with its number (people favour the first slots),
    the viewer state (the prompt without OPTIONS), then the whole slate it was chosen from
    (``context="slate"``, as the upstream discriminator saw it; ``"choice"`` leaves it out).
    The viewer comes before the slate: a text cut at ``gail_max_length`` tokens loses the end
    of the slate, not the viewer (with the slate first, every demo text of ~400 tokens lost
    its viewer at 256).

    >>> text = "VIEWER\\nage 30\\n\\nOPTIONS\\n1. A (from X)\\n2. B"
    >>> prompt = [{"role": "user", "content": text}]
    >>> choice_text(prompt, 2, context="choice")
    'CHOSEN 2. B\\n\\nVIEWER\\nage 30'
    >>> choice_text(prompt, 2)
    'CHOSEN 2. B\\n\\nVIEWER\\nage 30\\n\\nOPTIONS\\n1. A (from X)\\n2. B'
    >>> choice_text(prompt, 3) is None
    True
    """
    state, _, options = user_text(prompt).partition(OPTIONS_HEADER)
    lines = options.split("\n") if options else []
    if not 1 <= option <= len(lines):
        return None
    chosen = f"CHOSEN {lines[option - 1]}"
    if context == "slate":  # the viewer before the slate: a cut at gail_max_length ends the
        return f"{chosen}\n\n{state}{OPTIONS_HEADER}{options}"  # slate, never the viewer
    return f"{chosen}\n\n{state}"


WORD = re.compile(r"[a-z0-9]+")


def coarse(fragment: str) -> str:
    """A state fragment as a feature: lower case, decimals to one place, longer whole numbers
    to their first two digits (a view count or an age group, not each value apart).

    >>> coarse("Initial Viewpoint: 0.234 on Guns (0 to 1)"), coarse(" income $125000, age 34")
    ('initial viewpoint: 0.2 on guns (0 to 1)', 'income $12####, age 34')
    """
    fragment = re.sub(r"(\d+\.\d)\d+", r"\1", fragment.strip().lower())
    return re.sub(r"(?<![\d.])(\d\d)(\d+)", lambda m: m.group(1) + "#" * len(m.group(2)), fragment)


def crossed_features(text: str) -> list[str]:
    """The feature discriminator's reading of a discriminator text: its first line is the
    choice, the rest the state it was made in. The choice's position (its leading number) and
    words, and each state fragment (a line, or a ``;``-separated part of one: :func:`coarse`)
    crossed with the position and with each of the choice's words: a logistic regression on
    them learns who clicks what (the ranker's viewer x channel and title-word crosses), read
    from the text alone.

    >>> crossed_features("CHOSEN 2. Guns | 1:15\\n\\nage 34; rural")
    ['at=2', 'w=guns', 'd=1:15', 'age 34|at=2', 'age 34|w=guns', 'age 34|d=1:15', \
'rural|at=2', 'rural|w=guns', 'rural|d=1:15']
    """
    choice, _, state = text.partition("\n")
    named, *details = choice.removeprefix("CHOSEN ").split(" | ")
    number, _, title = named.partition(". ")
    action = [f"at={number}"] + [f"w={w}" for w in dict.fromkeys(WORD.findall(title.lower()))]
    action += [f"d={coarse(detail)}" for detail in details]
    fragments = [coarse(part) for line in state.split("\n") for part in line.split(";")]
    return action + [f"{f}|{a}" for f in dict.fromkeys(fragments) if f for a in action]
