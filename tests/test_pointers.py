"""Every pointer a reader follows names a page and section that exist: ``docs/PAGE.md`` and
``docs/PAGE.md#anchor`` anywhere in the tree (code, help text, Makefile, images, manifests,
recipes, docs), ``README "Section"`` / ``README: Section`` in code and help text, and the
relative links between docs pages. A heading moved or renamed fails here, not in a user's
hands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["src", "components", "pipelines", "docker", "k8s", "recipes", "bench", "tests", "docs"]
TOP = ["Makefile", "README.md", ".ci/run", "pyproject.toml"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ""}

GENERATED = {"reference.md"}  # written at build time by docs/hooks.py (mkdocs --strict checks it)
DOC_PATH = re.compile(r"(?<![\w/.])docs/([\w/.-]+?\.md)(?:#([\w-]+))?")
README_SECTION = re.compile(
    r"README(?:\.md)?[:,]?\s+(?:section\s+)?\"([^\"]+)\"|README:\s+([A-Z][\w ,'/-]+[\w])"
)
DOCS_LINK = re.compile(r"\]\(((?!https?:|mailto:|#)[^)\s]+?\.md)(?:#([\w-]+))?\)")


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading.

    >>> slug("Several GPUs, and the benchmark"), slug("`grail train` on a GPU")
    ('several-gpus-and-the-benchmark', 'grail-train-on-a-gpu')
    """
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[\s-]+", "-", text).strip("-")


def headings(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no '#' lines of code blocks
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)]


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in headings(page)}


def files(root: Path) -> list[Path]:
    found = [root / name for name in TOP if (root / name).is_file()]
    for folder in SCANNED:
        found += [
            p
            for p in (root / folder).rglob("*")
            if p.is_file() and p.suffix in SUFFIXES and ".venv" not in p.parts
        ]
    return [p for p in found if p != Path(__file__).resolve()]


def stale(root: Path = ROOT) -> list[str]:
    problems = []
    readme = {h.lower() for h in headings(root / "README.md")}
    for path in files(root):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        where = path.relative_to(root)
        for match in DOC_PATH.finditer(text):
            page, anchor = root / "docs" / match.group(1), match.group(2)
            if not page.is_file():
                problems.append(f"{where}: docs/{match.group(1)} does not exist")
            elif anchor and anchor not in anchors(page):
                problems.append(f"{where}: docs/{match.group(1)} has no section #{anchor}")
        for match in README_SECTION.finditer(text):
            section = (match.group(1) or match.group(2)).strip()
            if section.lower() not in readme:
                problems.append(f"{where}: README.md has no section {section!r}")
        if path.suffix == ".md" and "docs" in where.parts:
            for match in DOCS_LINK.finditer(text):
                target = (path.parent / match.group(1)).resolve()
                if target.name in GENERATED:
                    continue
                if not target.is_file():
                    problems.append(f"{where}: link to {match.group(1)}: no such page")
                elif match.group(2) and match.group(2) not in anchors(target):
                    problems.append(
                        f"{where}: link to {match.group(1)}#{match.group(2)}: no such section"
                    )
    return problems


def test_every_pointer_names_a_page_and_section_that_exist():
    assert stale() == []


def test_the_check_finds_a_stale_pointer(tmp_path):
    """The check itself fails on what it must catch (a moved section, a missing page)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Kept\n\n[b](b.md) [k](a.md#gone)\n")
    (tmp_path / "README.md").write_text("# Top\n\n## Two commands\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text(
        'x = "see docs/a.md#kept, docs/a.md#moved, docs/nope.md"\n'
        "y = 'README: Two commands; README \"Run on Kubeflow\"'\n"
    )
    found = "\n".join(stale(tmp_path))
    assert "docs/a.md has no section #moved" in found
    assert "docs/nope.md does not exist" in found
    assert "README.md has no section 'Run on Kubeflow'" in found
    assert "link to b.md: no such page" in found and "a.md#gone: no such section" in found
    assert "#kept" not in found and "'Two commands'" not in found


PATH_TOKEN = re.compile(
    r"(?<![\w/.:-])((?:pipelines|recipes|components|docker|k8s|src/grail|bench|docs)/[\w./{}-]*[\w}])"
)


def help_texts() -> dict[str, str]:
    """Every text ``grail --help`` and ``grail COMMAND --help`` print, by where it is written:
    the command list, each command's description (its config's docstring) and its options'
    help."""
    import dataclasses

    from grail.cli import COMMANDS

    texts = {"grail --help": "\n".join(c.help for c in COMMANDS.values())}
    for name, command in COMMANDS.items():
        for kind in command.types():
            texts[f"grail {name}: {kind.__name__}"] = "\n".join(
                [kind.__doc__ or ""]
                + [f.metadata.get("help", "") for f in dataclasses.fields(kind)]
            )
    return texts


def stale_help(root: Path = ROOT) -> list[str]:
    """Paths the help names that do not exist, the compiled pipelines `grail compile`'s
    one-line help leaves out, and the tasks the commands of every task describe one of."""
    from grail.cli import COMMANDS
    from grail.tasks import BUILT_IN, TASKS

    problems = []
    for where, text in help_texts().items():
        for path in PATH_TOKEN.findall(text):  # a {placeholder} stands for any name
            pattern = re.sub(r"\{\w+\}", "*", path)
            if not [*root.glob(pattern), *(root / "src/grail").glob(pattern)]:
                problems.append(f"{where}: {path} does not exist")
    for task in BUILT_IN:
        name = TASKS[task].dag.file
        if f"pipelines/{name}" not in COMMANDS["compile"].help:
            problems.append(f"grail --help: compile does not name pipelines/{name} ({task})")
    for name in ("simulate", "clean"):
        described = " ".join(kind.__doc__ or "" for kind in COMMANDS[name].types())
        problems += [
            f"grail {name} --help: task {task} is not described"
            for task in TASKS
            if task not in described
        ]
    return problems


def test_the_help_names_what_exists_and_every_task_it_serves():
    assert stale_help() == []


def test_the_front_page_names_the_packages_and_tasks_there_are():
    """docs/index.md's package list names packages of src/grail/ (not the `data` and `evaluate`
    of long ago), and every task is on the front page."""
    from grail.tasks import TASKS

    text = (ROOT / "docs/index.md").read_text()
    listed = re.search(r"package in `src/grail/` \(([^)]*)\)", text)
    assert listed, "docs/index.md no longer lists the stage packages"
    names = re.findall(r"`(\w+)`", listed.group(1))
    assert names and all((ROOT / "src/grail" / n / "__init__.py").is_file() for n in names), names
    assert [t for t in TASKS if f"`{t}`" not in text and t not in text.lower()] == []


TREE_ENTRY = re.compile(r"^( *)((?:[\w.-]+(?:\.py|/)(?:, )?)+)(?:\s|$)")


def layout_tree(page: Path) -> set[str]:
    """The modules and folders the ``src/grail/`` tree of docs/code-layout.md names, as paths
    below ``src/grail`` (two spaces a level; ``raw.py, capsule.py`` names two)."""
    block = page.read_text().split("```\nsrc/grail/\n", 1)[1].split("```", 1)[0]
    named, parents = set(), []
    for line in block.splitlines():
        match = TREE_ENTRY.match(line)
        if not match or len(match.group(1)) % 2:
            continue  # a description's continuation line
        depth = len(match.group(1)) // 2 - 1
        parents = parents[:depth]
        for name in match.group(2).rstrip(", ").split(", "):
            named.add("/".join([*parents, name.rstrip("/")]))
        if match.group(2).endswith("/"):
            parents.append(match.group(2).rstrip("/"))
    return named


def package_readme_names(readme: Path) -> set[str]:
    """The modules of its own folder a package's README.md names (``x.py`` or ``x.attr``)."""
    here = {p.stem for p in readme.parent.glob("*.py")} | {
        p.name for p in readme.parent.iterdir() if p.is_dir()
    }
    names = set(re.findall(r"`([\w]+)\.py`", readme.read_text()))
    names |= {n for n in re.findall(r"`([\w]+)\.\w+", readme.read_text()) if n in here}
    return names


def test_the_code_layout_and_package_readmes_name_every_module_and_only_modules_that_exist():
    """docs/code-layout.md's tree and each package README drifted (a ``pipelines/summarize.py``
    long gone, no ``overrides.py``): every module they name exists, and every module of
    ``src/grail`` is named: in the tree, or in its folder's own README.md."""
    src = ROOT / "src" / "grail"
    named = layout_tree(ROOT / "docs" / "code-layout.md")
    modules = {
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    folders = {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_dir()}
    gone = sorted(n for n in named if n not in modules | folders)
    assert gone == [], f"docs/code-layout.md names what does not exist: {gone}"
    # a module is in the tree unless its folder has a README of its own, which lists it
    readmes = {r.parent.relative_to(src).as_posix(): r for r in src.rglob("README.md")}
    unnamed = sorted(m for m in modules - named if m.rpartition("/")[0] not in readmes)
    assert unnamed == [], f"docs/code-layout.md's tree leaves out: {unnamed}"
    for readme in readmes.values():
        here = {p.stem for p in readme.parent.glob("*.py") if p.name != "__init__.py"}
        names = package_readme_names(readme)
        missing = sorted(here - names)
        assert missing == [], f"{readme.relative_to(ROOT)} leaves out: {missing}"
        text = readme.read_text()
        gone = sorted(n for n in re.findall(r"`([\w]+)\.py`", text) if n not in here)
        assert gone == [], f"{readme.relative_to(ROOT)} names modules that are gone: {gone}"


def test_the_layout_check_finds_a_module_gone(tmp_path):
    page = tmp_path / "layout.md"
    page.write_text(
        "```\nsrc/grail/\n  core/               x\n    errors.py           a\n"
        "                        wrapped line.py\n    raw.py, capsule.py  b\n  cli.py  c\n```\n"
    )
    named = {"core", "core/errors.py", "core/raw.py", "core/capsule.py", "cli.py"}
    assert layout_tree(page) == named
