"""Counterfactual sessions (grail counterfactual): the truth simulator against the study's own
sessions, deterministic recommenders, zero error for a simulator equal to the truth, an
effect computed by hand on a toy catalogue, and the factual arm against people (the one
comparison a real study allows)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from grail.cli import main
from grail.core.errors import GrailError
from grail.tasks.slate.benchmark.systems import load_truth
from grail.tasks.slate.contract import read_dataset
from grail.tasks.slate.counterfactual.outcomes import closer_than, outcome_table, summarize
from grail.tasks.slate.counterfactual.people import (
    agreement,
    observed_table,
    people_sessions,
    shown_slates,
)
from grail.tasks.slate.counterfactual.recommenders import RECOMMENDERS, Context
from grail.tasks.slate.counterfactual.rollout import Study, Viewer, roll_out, truth_simulator
from grail.tasks.slate.counterfactual.stage import load_study, sample_viewers
from grail.tasks.slate.world import ChoiceModel, Video


def study_and_viewers(clean: Path, count: int, split=None):
    study, _ = load_study(clean)
    stances = {k: v["stance"] for k, v in (load_truth(clean, None) or {}).items()}
    rows = read_dataset(clean, split=split).to_pylist()
    study = dataclasses.replace(study, shown=shown_slates(read_dataset(clean).to_pylist()))
    return study, sample_viewers(rows, stances, count, seed=0), rows


def test_truth_on_the_factual_arm_reproduces_the_studys_own_sessions(small_clean):
    """The study's own sessions (every kept click of every participant) and the truth
    simulator's sessions under the factual recommender, from the same start videos, agree on
    the clicked slant and the like-minded share within sampling error."""
    study, viewers, rows = study_and_viewers(small_clean, 10_000)
    side = {v.participant_id: v.side for v in viewers}
    real: dict[str, list[float]] = {}
    for row in rows:
        if row["participant_id"] in side and row["session_id"].startswith("s"):
            slant = study.videos[row["gold_id"]].slant * side[row["participant_id"]]
            real.setdefault(row["participant_id"], []).append(slant)
    sessions = roll_out(study, viewers, ["factual"], {"truth": truth_simulator(study)}, 4, seed=3)
    simulated = {
        viewers[s.viewer].participant_id: [
            study.videos[v].slant * viewers[s.viewer].side for v in s.watched[1:]
        ]
        for s in sessions
    }
    for name, of in {"slant": lambda x: x, "like_minded": lambda x: float(x > 0)}.items():
        a = np.array([np.mean([of(x) for x in xs]) for xs in real.values()])
        b = np.array([np.mean([of(x) for x in xs]) for xs in simulated.values() if xs])
        error = np.hypot(a.std() / np.sqrt(len(a)), b.std() / np.sqrt(len(b)))
        assert abs(a.mean() - b.mean()) < 4 * error, (name, a.mean(), b.mean(), error)
    assert len(real) > 150 and sum(map(len, real.values())) > 500


def test_recommenders_are_deterministic_given_a_seed_and_never_repeat_a_watched_video(
    small_clean,
):
    """Every recommender but `replayed`, which shows a slate as people were shown it."""
    study, viewers, _ = study_and_viewers(small_clean, 3)
    viewer = viewers[0]
    catalogue = study.catalogue[viewer.issue]
    watched = (viewer.start, catalogue[3].id)
    shown = study.shown[viewer.start]
    assert len(set(shown)) > 1  # so `replayed` has slates to choose from
    context = Context(catalogue, study.videos[viewer.start], watched, viewer.side, 4, shown)
    for name, recommend in RECOMMENDERS.items():
        first = recommend(context, np.random.default_rng(5))
        assert first == recommend(context, np.random.default_rng(5)), name
        if name == "replayed":
            assert tuple(first) in shown, name
            continue
        assert not set(first) & set(watched) and len(set(first)) == len(first) <= 4, name
        draws = {tuple(recommend(context, np.random.default_rng(k))) for k in range(6)}
        assert (len(draws) == 1) == (name == "popularity"), name  # only popularity ignores rng
    like = RECOMMENDERS["like_minded"](context, np.random.default_rng(0))
    cross = RECOMMENDERS["cross_cutting"](context, np.random.default_rng(0))
    assert all(study.videos[v].slant * viewer.side > 0 for v in like)
    assert all(study.videos[v].slant * viewer.side < 0 for v in cross)
    # replayed shows each slate people were shown after this video, as shown, and no other
    replays = {
        tuple(RECOMMENDERS["replayed"](context, np.random.default_rng(k))) for k in range(60)
    }
    assert replays == set(shown)


def test_a_simulator_equal_to_the_truth_has_zero_error_everywhere(small_clean):
    study, viewers, _ = study_and_viewers(small_clean, 12, split="validation")
    truth = truth_simulator(study)
    names = list(RECOMMENDERS)
    sessions = roll_out(study, viewers, names, {"truth": truth, "copy": truth}, 3, seed=1)
    table = outcome_table(sessions, viewers, study)
    results = summarize(table, viewers, 206, [("like_minded", "cross_cutting")], 200, 0)
    assert len(results["errors"]) == len(names) * 5
    for key, entry in results["errors"].items():  # reach: no interval (outcomes.py)
        assert entry["error"] == 0 and entry.get("ci", [0, 0]) == [0, 0], key
        assert ("ci" in entry) == (not key.endswith("/reach")), key
    effect = results["effects"]["like_minded-cross_cutting/copy/slant"]
    assert effect["error"] == 0 and effect["effect"] > 0.5  # like-minded pulls toward the side
    # and a simulator that differs is measured as different
    first = {"first": lambda states: [np.eye(len(s.slate))[0] for s in states]}
    other = roll_out(study, viewers, names, {"truth": truth, **first}, 3, seed=1)
    errors = summarize(outcome_table(other, viewers, study), viewers, 206, [], 200, 0)["errors"]
    assert any(abs(e["error"]) > 0.05 for e in errors.values())


def video(k: int, slant: float) -> Video:
    return Video(f"v{k}", "gun_control", slant, f"Video {k}", "Channel", 60, 10 + k, 1, 1)


def test_always_first_predicts_the_effect_computed_by_hand_on_a_toy_catalogue():
    """A catalogue of four pro videos (+1), four anti (-1) and a neutral start: like-minded
    shows only +1 to a pro viewer, cross-cutting only -1, so always-first clicks +1 (or -1) at
    every step: the slant effect is exactly 2, the like-minded share effect 1 and the opinion
    shift effect shift * 2k / (k + 1) over k clicks (the start video counts as watched)."""
    catalogue = (
        video(0, 0.0),
        *(video(k, 1.0) for k in range(1, 5)),
        *(video(k, -1.0) for k in range(5, 9)),
    )
    study = Study(
        videos={v.id: v for v in catalogue},
        catalogue={"gun_control": catalogue},
        popularity_z={v.id: 0.0 for v in catalogue},
        model=ChoiceModel(),
        opinion_shift=0.07,
        slate_sizes={2: 0.5, 3: 0.5},
    )
    viewers = [Viewer(f"p{k}", "study1", "gun_control", {}, 0.8, 0.6, "v0") for k in range(5)]
    first = {
        "truth": truth_simulator(study),
        "first": lambda states: [np.eye(len(s.slate))[0] for s in states],
    }
    steps = 3
    sessions = roll_out(study, viewers, ["like_minded", "cross_cutting"], first, steps, seed=0)
    table = outcome_table(sessions, viewers, study)
    effects = summarize(table, viewers, len(catalogue), [("like_minded", "cross_cutting")], 100, 0)[
        "effects"
    ]
    assert effects["like_minded-cross_cutting/first/slant"]["effect"] == 2.0
    assert effects["like_minded-cross_cutting/first/like_minded"]["effect"] == 1.0
    shift = effects["like_minded-cross_cutting/first/opinion_shift"]["effect"]
    assert shift == pytest.approx(0.07 * 2 * steps / (steps + 1), abs=1e-6)
    # every like-minded session clicked distinct pro videos, first of each slate
    for s in sessions:
        assert len(set(s.watched)) == steps + 1
    # a level (one recommender's outcome, not a difference): on one-sided slates always-first
    # and the truth click the same side, so neither is closer; the effect the same
    for effect in (("like_minded", None), ("like_minded", "cross_cutting")):
        gap = closer_than(table, viewers, len(catalogue), effect, "like_minded", "first", "first")
        assert gap == {"gap": 0.0, "ci": [0.0, 0.0]}


def test_the_like_minded_share_on_balanced_slates_tells_simulators_apart(small_clean):
    """On random slates (both sides) what is clicked is the viewer's choice: a simulator that
    copies the truth is closer to it than always-first, with an interval excluding zero."""
    study, viewers, _ = study_and_viewers(small_clean, 30, split="validation")
    truth = truth_simulator(study)
    simulators = {
        "truth": truth,
        "copy": truth,
        "first": lambda states: [np.eye(len(s.slate))[0] for s in states],
    }
    sessions = roll_out(study, viewers, ["random"], simulators, 4, seed=1)
    table = outcome_table(sessions, viewers, study)
    gap = closer_than(table, viewers, 206, ("random", None), "like_minded", "copy", "first", 200)
    assert gap["gap"] < 0 and gap["ci"][1] < 0


def test_grail_counterfactual_with_a_tiny_model_writes_its_report(
    small_clean, tiny_policy, tmp_path
):
    out = tmp_path / "cf"
    main(
        ["counterfactual", "--data", str(small_clean), "--out", str(out), "--viewers", "6",
         "--steps", "2", "--bootstrap", "50", "--model", f"tiny={tiny_policy}"]
    )  # fmt: skip
    results = json.loads((out / "counterfactual.json").read_text())
    assert results["settings"]["simulators"] == ["truth", "position_prior", "ranker", "tiny"]
    assert "random-cross_cutting/tiny/slant" in results["effects"]
    judged = {(v["effect"], v["metric"]) for v in results["verdicts"]}
    assert judged == {
        ("random-cross_cutting", "slant"),
        ("random-cross_cutting", "opinion_shift"),
        ("random", "like_minded"),
        ("factual", "like_minded"),
    }
    report = (out / "report.md").read_text()
    assert "| factual |" in report and "tiny, random-cross_cutting on slant" in report
    assert "tiny, random slates on like_minded: " in report
    assert (out / "outcomes.svg").read_text().startswith("<?xml")


def test_the_default_effect_needs_its_recommenders_a_given_one_is_checked(tmp_path):
    from grail.tasks.slate.counterfactual.config import CounterfactualConfig

    alone = CounterfactualConfig(data="d", out="o", recommenders=["replayed"])
    assert alone.effect == []  # the default effect, its recommenders not rolled out
    assert CounterfactualConfig(data="d", out="o").effect == ["random-cross_cutting"]
    with pytest.raises(GrailError, match="effect random-factual: expected A-B"):
        CounterfactualConfig(data="d", out="o", recommenders=["random"], effect=["random-factual"])


def test_unknown_recommender_and_a_folder_not_cleaned_are_one_line(small_clean, tmp_path, capsys):
    given = ["--out", str(tmp_path / "o"), "--recommenders", "echo_chamber"]
    assert main(["counterfactual", "--data", str(small_clean), *given]) == 2
    assert "recommenders: unknown echo_chamber" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    assert main(["counterfactual", "--data", str(bare), "--out", str(tmp_path / "o")]) == 2
    error = capsys.readouterr().err
    assert f"{bare}: no _COMPLETE.json" in error and len(error.strip().splitlines()) == 1


def test_the_truth_on_the_replayed_arm_agrees_with_people(small_clean):
    """What a real study can score is checked where the truth is known: the study's own choice
    model, replaying the slates people were shown from each viewer's start video, clicks the
    first slot as often as people did and videos as popular, within sampling error; and the
    always-first simulator's first-slot share is exactly 1, people's exactly their rows'."""
    study, viewers, rows = study_and_viewers(small_clean, 10_000)
    first = {"first": lambda states: [np.eye(len(s.slate))[0] for s in states]}
    sims = {"truth": truth_simulator(study), **first}
    sessions = roll_out(study, viewers, ["replayed"], sims, 4, seed=2)
    people = people_sessions(rows, viewers, 4)
    table = observed_table(sessions, people, viewers, study)
    for metric in ("first_slot", "popularity"):
        a, b = table["people"][metric], table["truth"][metric]
        kept = ~np.isnan(a) & ~np.isnan(b)
        d = a[kept] - b[kept]
        assert abs(d.mean()) < 4 * d.std() / np.sqrt(kept.sum()), (metric, d.mean())
    assert len(viewers) > 200 and kept.sum() > 0.9 * len(viewers)
    assert np.nanmean(table["first"]["first_slot"]) == 1.0
    by_session = {}
    for row in rows:
        by_session.setdefault(row["session_id"], {})[row["step_index"]] = row
    hand = []
    for viewer in viewers:  # the consecutive kept steps of the viewer's first session
        steps, k = by_session[viewer.session], 0
        while k < 4 and k in steps:
            hand.append(steps[k]["gold_index"] == 1)
            k += 1
    assert sum(len(s.positions) for s in people) == len(hand)
    summary = agreement(table, viewers, 206, ["first"], ["truth"], 100, 0)
    assert summary["cells"]["people/first_slot"]["value"] == pytest.approx(
        np.nanmean([np.mean(p.positions[:4] == np.zeros(len(p.positions[:4])))
                    for p in people if p.positions]), abs=1e-6
    )  # fmt: skip
    assert 0.3 < np.mean(hand) < 0.6  # the study's first-slot preference, people's side
    first_gap = [v for v in summary["verdicts"] if v["metric"] == "first_slot"][0]
    assert first_gap["gap"] > 0 and first_gap["ci"][0] > 0  # always-first is further off


def test_people_sessions_stop_at_the_first_dropped_step():
    def row(step, current, gold, index):
        slate = [{"id": "x"}, {"id": gold}] if index == 2 else [{"id": gold}, {"id": "x"}]
        return {"session_id": "s", "step_index": step, "current_video": {"id": current},
                "gold_id": gold, "gold_index": index, "slate": slate}  # fmt: skip

    viewer = Viewer("p", "study1", "gun_control", {}, 0.5, float("nan"), "a", "s")
    rows = [row(0, "a", "b", 2), row(1, "b", "c", 1), row(3, "d", "e", 1)]  # step 2 dropped
    (session,) = people_sessions(rows, [viewer], 5)
    assert session.watched == ["a", "b", "c"] and session.positions == [1, 0]


def test_a_study_without_truth_scores_the_replayed_arm_against_people_only(
    small_study, tiny_policy, tmp_path
):
    """A real study (its raw export without the truth files, cleaned): only the replayed arm
    runs, no truth simulator, no effect; the report says what cannot be scored."""
    from grail.clean.stage import clean

    raw = tmp_path / "raw"
    shutil.copytree(small_study, raw, ignore=shutil.ignore_patterns("truth*"))
    real = tmp_path / "real"
    clean(raw, real)
    assert not (real / "truth.json").exists()
    out = tmp_path / "cf"
    code = main(
        ["counterfactual", "--data", str(real), "--out", str(out), "--viewers", "8",
         "--steps", "3", "--bootstrap", "50", "--model", f"tiny={tiny_policy}"]
    )  # fmt: skip
    assert code == 0
    results = json.loads((out / "counterfactual.json").read_text())
    settings = results["settings"]
    assert settings["known_truth"] is False and settings["recommenders"] == ["replayed"]
    assert settings["simulators"] == ["position_prior", "ranker", "tiny"]
    assert "factual" in settings["not_scored"] and "effects" not in results
    assert {v["model"] for v in results["people"]["verdicts"]} == {"tiny"}
    people = results["people"]
    assert people["clicks"]["people"] > 8 and people["clicks"]["tiny"] > 0
    assert all(c["value"] is not None for c in people["cells"].values())
    assert all(e.get("ci") for k, e in people["differences"].items() if "reach" not in k)
    # people's first-slot share by hand: the same 8 viewers (seed 0), each one's first session
    # from step 0 while its steps follow on, each viewer's share, averaged over viewers
    rows = read_dataset(real, split="validation").to_pylist()
    steps: dict = {}
    for row in rows:
        steps.setdefault(row["session_id"], {})[row["step_index"]] = row
    shares = []
    for viewer in sample_viewers(rows, None, 8, seed=0):
        of, current, clicks = steps[viewer.session], viewer.start, []
        while len(clicks) < 3 and len(clicks) in of:
            row = of[len(clicks)]
            if row["current_video"]["id"] != current:
                break
            clicks.append(row["gold_index"] == 1)
            current = row["gold_id"]
        shares.append(np.mean(clicks))
    assert people["cells"]["people/first_slot"]["value"] == pytest.approx(np.mean(shares), abs=1e-6)
    report = (out / "report.md").read_text()
    assert "no known choice model" in report and "## The factual arm against people" in report
    assert "tiny on first_slot:" in report


def test_the_people_comparison_computed_by_hand_on_a_toy_study():
    """Four videos, two viewers, fixed slates: a simulated session longer than people's is
    cut, one that ends early (no slate was shown after its video) keeps its clicks, a slate
    holding a watched video is replayed as shown, unknown views leave a viewer's popularity
    out of the pairing."""
    videos = {
        "s": video(0, 0.0),
        "a": Video("a", "gun_control", 0.0, "A", "C", 60, 9, 1, 1),
        "b": Video("b", "gun_control", 0.0, "B", "C", 60, 99, 1, 1),
        "c": Video("c", "gun_control", 0.0, "C", "C", 60, None, 1, 1),
    }
    videos["s"] = Video("s", "gun_control", 0.0, "S", "C", 60, 999, 1, 1)
    shown = {"s": (("a", "b"),), "a": (("s", "c"),), "b": (("c", "a"),)}  # none after "c"
    study = Study(
        videos, {"gun_control": tuple(videos.values())}, {}, None, float("nan"), {2: 1.0}, shown
    )
    viewers = [
        Viewer("p0", "study1", "gun_control", {}, 0.5, float("nan"), "s", "x0"),
        Viewer("p1", "study1", "gun_control", {}, 0.5, float("nan"), "s", "x1"),
    ]
    first = {"first": lambda states: [np.eye(len(s.slate))[0] for s in states]}
    sessions = roll_out(study, viewers, ["replayed"], first, 3, seed=0)
    # always-first: s -> a -> s (a watched video, as shown) -> a, for both viewers
    assert [s.watched for s in sessions] == [["s", "a", "s", "a"]] * 2

    def row(session, step, current, gold, index, slate):
        return {
            "session_id": session,
            "step_index": step,
            "current_video": {"id": current},
            "gold_id": gold,
            "gold_index": index,
            "slate": [{"id": v} for v in slate],
        }

    rows = [
        row("x0", 0, "s", "b", 2, ("a", "b")),  # people: p0 clicks b (slot 2), then c (slot 1)
        row("x0", 1, "b", "c", 1, ("c", "a")),
        row("x1", 0, "s", "a", 1, ("a", "b")),  # p1 clicks a (slot 1), then c (slot 2) ...
        row("x1", 1, "a", "c", 2, ("s", "c")),
        row("x1", 2, "c", "b", 1, ("b", "a")),  # ... then b, and 3 clicks in all
    ]
    people = people_sessions(rows, viewers, 3)
    assert [p.positions for p in people] == [[1, 0], [0, 1, 0]]
    table = observed_table(sessions, people, viewers, study)
    # first is cut to 2 clicks for p0, kept at 3 for p1
    assert table["first"]["positions"] == [[0, 0], [0, 0, 0]]
    summary = agreement(table, viewers, 4, ["first"], [], 50, 0)
    cells, differences = summary["cells"], summary["differences"]
    assert cells["people/first_slot"]["value"] == pytest.approx((1 / 2 + 2 / 3) / 2, abs=1e-6)
    assert cells["first/first_slot"]["value"] == 1.0
    assert differences["first/first_slot"]["difference"] == pytest.approx(1 - 7 / 12, abs=1e-6)
    # popularity: p0's people clicks b (99 views) and c (unknown): log10(100) = 2
    assert table["people"]["popularity"][0] == pytest.approx(2.0)
    log10 = np.log10
    assert table["people"]["popularity"][1] == pytest.approx((log10(10) + log10(100)) / 2)
    assert table["first"]["popularity"][0] == pytest.approx((log10(10) + log10(1000)) / 2)
    assert summary["clicks"] == {"people": 5, "first": 5}
    # reach: people clicked b, c, a (3 of 4 videos), always-first a and s
    assert cells["people/reach"]["value"] == 0.75 and cells["first/reach"]["value"] == 0.5
    assert "ci" not in differences["first/reach"]
    # a session that ends early keeps what it clicked: no slate was ever shown after c
    last = {"last": lambda states: [np.eye(len(s.slate))[-1] for s in states]}
    ended = roll_out(study, viewers, ["replayed"], last, 4, seed=0)
    assert [s.watched for s in ended] == [["s", "b", "a", "c"]] * 2
    longer = people_sessions([*rows, row("x1", 3, "b", "a", 2, ("c", "a"))], viewers, 4)
    counted = agreement(observed_table(ended, longer, viewers, study), viewers, 4, [], [], 50, 0)
    assert counted["clicks"] == {"people": 6, "last": 5}  # p0 cut to 2; p1 3 of people's 4


@pytest.mark.parametrize(
    "given, said",
    [
        (["--bootstrap", "0"], "bootstrap: expected at least 1, got 0"),
        (["--bootstrap", "-1"], "bootstrap: expected at least 1, got -1"),
        (["--batch_size", "0"], "batch_size: expected at least 1, got 0"),
        (["--seed", "-1"], "seed: expected 0 or more, got -1"),
        (["--start_model", "{tmp}/gone"], "start_model: {tmp}/gone: no such model folder"),
        (["--models", "{tmp}/broken"], "{tmp}/broken: not a model transformers can load"),
        (["--models", "{tmp}/garbled"], "{tmp}/garbled: not a model transformers can load"),
    ],
    ids=["bootstrap-0", "bootstrap-negative", "batch-0", "seed", "start", "truncated", "config"],
)
def test_what_was_a_traceback_is_one_line(small_clean, tmp_path, capsys, given, said):
    """The probe's counterfactual tracebacks: a truncated model.safetensors, a garbage
    config.json, a missing --start_model, --bootstrap 0 or -1, --batch_size 0, --seed -1."""
    from grail.train.tiny import build_tiny_model

    if any("broken" in g or "garbled" in g for g in given):
        model = build_tiny_model(tmp_path / "model", layers=1, hidden_size=16, heads=2)
        for name in ("broken", "garbled"):
            shutil.copytree(model, tmp_path / name)
        weights = tmp_path / "broken" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
        (tmp_path / "garbled" / "config.json").write_text("{not json")
        capsys.readouterr()  # the build's log
    argv = [g.format(tmp=tmp_path) for g in given]
    argv += (
        ["--viewers", "2", "--steps", "1", "--bootstrap", "20"]
        if "bootstrap" not in "".join(given)
        else ["--viewers", "2", "--steps", "1"]
    )
    code = main(["counterfactual", "--data", str(small_clean), "--out", str(tmp_path / "o"), *argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert said.format(tmp=tmp_path) in lines[0] and "Traceback" not in lines[0]
    assert not (tmp_path / "o").exists()
