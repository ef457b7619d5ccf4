"""The minimum-wage recipes are written from their gun-control twins (grail.recipes.twins):
an edit to a ``_gun`` recipe that its ``_wage`` twin lacks fails here, naming the file."""

from __future__ import annotations

import pytest
from grail.recipes.twins import twin, twins


def test_every_wage_recipe_is_its_gun_twin_rewritten():
    found = twins()
    assert len(found) == 3, sorted(found)  # bc, grpo and grail of Qwen2.5-1.5B-Instruct
    drifted = [str(p) for p, text in found.items() if not p.is_file() or p.read_text() != text]
    assert drifted == [], "run python -m grail.recipes.twins"


def test_a_twin_rewrites_the_issue_its_folders_and_nothing_else():
    gun = "# GRPO, gun control (study1)\n# Run: config_grpo_gun.yaml\nissues: [gun_control]\n"
    gun += "output_dir: /outputs/q-grpo-gun\nbeta: 0.0\n"
    assert twin(gun) == (
        "# GRPO, minimum wage (study2 + study3)\n# Run: config_grpo_wage.yaml\n"
        "issues: [minimum_wage]\noutput_dir: /outputs/q-grpo-wage\nbeta: 0.0\n"
    )
    with pytest.raises(ValueError, match="without 'issues: \\[gun_control\\]'"):
        twin(gun.replace("issues: [gun_control]", "issues: [gun_control, minimum_wage]"))
