"""What GRAIL's discriminator (:mod:`grail.train.gail`) reads of a slate: the option a reply
chose, with its number, then the viewer and the slate it was chosen from."""

from __future__ import annotations

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
