"""Does a system read? The same rows asked again with what a reader needs taken away.

- ``viewer``: each participant's viewer lines (``VIEWER``, ``Initial Viewpoint``, ``SURVEY
  HIGHLIGHTS``: the row's ``viewer`` and ``opinion_before``) swapped for another participant's
  of the same issue; the session (what they watch, watched, and are offered) kept;
- ``options``: each row's options (their titles, channels, counts) swapped for those of another
  row of the same issue and slate size, in their positions; the position the person chose kept.

A system that reads the viewer or the videos finds what people did less likely on the swapped
rows; one that sits on the position prior stays put. The score is the paired difference in
log-loss (swapped minus as shown, so a reader's is positive) with a participant-bootstrap
interval: the ablation critics of Centaur asked for. Each swap is a seeded cyclic shift of a
shuffled order (a derangement: nobody keeps their own), the same for every system.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from grail.core import bootstrap
from grail.tasks.slate import metrics as m

ABLATIONS = ("viewer", "options")  # what each swap takes away; metrics' names are reads_NAME
VIEWER_FIELDS = ("viewer", "opinion_before")


def _shifted(keys: list, seed: int) -> dict:
    """Each key's donor: the next key in a seeded order (every key moved when there are two or
    more; one key keeps its own).

    >>> donors = _shifted(["a", "b", "c"], 0)
    >>> sorted(donors) == ["a", "b", "c"] and all(k != v for k, v in donors.items())
    True
    """
    order = [keys[i] for i in np.random.default_rng(seed).permutation(len(keys))]
    return {key: order[(i + 1) % len(order)] for i, key in enumerate(order)}


def swap_viewers(rows: list[dict], seed: int = 0) -> list[dict]:
    """The rows with each participant's viewer fields taken from another participant of the
    same issue (that participant's first row).

    >>> rows = [{"participant_id": p, "issue": "i", "viewer": {"pid1": p}, "opinion_before": v}
    ...         for p, v in (("a", 0.1), ("b", 0.9))]
    >>> [(r["viewer"]["pid1"], r["opinion_before"]) for r in swap_viewers(rows)]
    [('b', 0.9), ('a', 0.1)]
    """
    first: dict[tuple, dict] = {}
    for row in rows:
        first.setdefault((row["issue"], row["participant_id"]), row)
    by_issue = defaultdict(list)
    for issue, person in first:
        by_issue[issue].append(person)
    donor = {
        (issue, person): (issue, other)
        for issue, people in by_issue.items()
        for person, other in _shifted(sorted(people), seed).items()
    }
    return [
        row | {f: first[donor[(row["issue"], row["participant_id"])]].get(f) for f in VIEWER_FIELDS}
        for row in rows
    ]


def swap_options(rows: list[dict], seed: int = 0) -> list[dict]:
    """The rows with each slate taken from another row of the same issue and size, the chosen
    position kept (``gold_id`` follows it).

    >>> rows = [{"issue": "i", "n_options": 2, "gold_index": 1,
    ...          "slate": [{"id": f"{k}a"}, {"id": f"{k}b"}]} for k in range(2)]
    >>> [(r["slate"][0]["id"], r["gold_id"]) for r in swap_options(rows)]
    [('1a', '1a'), ('0a', '0a')]
    """
    groups = defaultdict(list)
    for i, row in enumerate(rows):
        groups[(row["issue"], row["n_options"])].append(i)
    donor = {}
    for members in groups.values():
        donor |= _shifted(members, seed)
    swapped = []
    for i, row in enumerate(rows):
        slate = rows[donor[i]]["slate"]
        swapped.append(row | {"slate": slate, "gold_id": slate[row["gold_index"] - 1]["id"]})
    return swapped


SWAPS = {"viewer": swap_viewers, "options": swap_options}


def ablated_rows(rows: list[dict], seed: int = 0) -> dict[str, list[dict]]:
    """Each ablation's rows (:data:`ABLATIONS`)."""
    return {name: SWAPS[name](rows, seed) for name in ABLATIONS}


def reads(
    shown: list[list[float]],
    swapped: list[list[float]],
    rows: list[dict],
    replicates: int,
) -> dict:
    """Log-loss on the swapped rows minus on the rows as shown (a system's distributions over
    each; the person's chosen position is the same in both), paired, with a
    participant-bootstrap interval.

    >>> rows = [{"gold_index": 1, "participant_id": p} for p in "abcd"]
    >>> reads([[0.9, 0.1]] * 4, [[0.5, 0.5]] * 4, rows, 100)["difference"]
    0.5878
    """
    golds = [r["gold_index"] for r in rows]
    before = [m.row_log_loss(d, g) for d, g in zip(shown, golds, strict=True)]
    after = [m.row_log_loss(d, g) for d, g in zip(swapped, golds, strict=True)]
    people = [r["participant_id"] for r in rows]
    return bootstrap.paired_difference(after, before, people, replicates)
