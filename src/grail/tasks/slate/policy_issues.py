"""The study's two issues and every name each one goes by, in one place.

>>> ISSUES["minimum_wage"].short, ALIASES["minwage"], SUBJECT_NAMES["gun_control"]
('wage', 'minimum_wage', 'gun')
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Issue:
    key: str  # in the dataset contract and on the command line: gun_control
    short: str  # in recipe file names and model names: config_grpo_gun.yaml, grpo-gun
    raw: str  # as the raw export's sessions (and grail simulate) write it
    spellings: tuple[str, ...]  # other spellings accepted when reading a raw export
    label: str  # in prompts: "Initial Viewpoint: 0.40 on gun control (...)"
    scale: str  # what 0 and 1 mean on the opinion index
    opinion_columns: tuple[str, str]  # the survey's index before and after (waves 1 and 2)
    capsule_trees: str  # the CodeOcean capsule's recommendation-tree folder


ISSUES = {
    issue.key: issue
    for issue in (
        Issue(
            key="gun_control",
            short="gun",
            raw="gun",
            spellings=("guns", "guncontrol"),
            label="gun control",
            scale="0 = favours stricter gun laws, 1 = favours gun rights",
            opinion_columns=("gun_index", "gun_index_2"),
            capsule_trees="trees_gun",
        ),
        Issue(
            key="minimum_wage",
            short="wage",
            raw="minwage",
            spellings=("min_wage", "minimumwage"),
            label="the minimum wage",
            scale="0 = opposes a $15 minimum wage, 1 = supports it",
            opinion_columns=("mw_index_w1", "mw_index_w2"),
            capsule_trees="trees_wage",
        ),
    )
}
# Every spelling a raw export may use, to the issue's key.
ALIASES = {
    name: issue.key
    for issue in ISSUES.values()
    for name in (issue.key, issue.short, issue.raw, *issue.spellings)
}


# Each issue's short name (grail.tasks.short_name: recipe paths and model names).
SUBJECT_NAMES = {issue.key: issue.short for issue in ISSUES.values()}
