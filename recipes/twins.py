"""The minimum-wage recipes, written from their gun-control twins: a ``*_wage.yaml`` differs
from its ``*_gun.yaml`` only in the issue it trains on, the study it names and its folders.

Run: ``python -m grail.recipes.twins`` after editing a ``_gun`` recipe (a test fails while a
``_wage`` file differs from what this writes)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
# what a gun-control recipe says -> what its minimum-wage twin says instead, in this order
WAGE = (
    ("gun control (study1)", "minimum wage (study2 + study3)"),
    ("issues: [gun_control]", "issues: [minimum_wage]"),
    ("_gun.yaml", "_wage.yaml"),
    ("-gun", "-wage"),
)


def twin(text: str) -> str:
    """A gun-control recipe's text as its minimum-wage twin's."""
    for gun, wage in WAGE:
        if gun not in text:
            raise ValueError(f"a gun-control recipe without {gun!r}: its twin would be wrong")
        text = text.replace(gun, wage)
    return text


def twins(folder: Path = HERE) -> dict[Path, str]:
    """Every ``_wage`` recipe below `folder` and the text it should have."""
    return {
        gun.with_name(gun.name.replace("_gun.yaml", "_wage.yaml")): twin(gun.read_text())
        for gun in sorted(folder.rglob("*_gun.yaml"))
    }


if __name__ == "__main__":
    for path, text in twins().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(HERE)}")
