"""The tracking component on its own: the shared checks (tests/component_checks.py) and its
body's task with fakes in place of KFP's artifacts and of the stage."""

from component_checks import folder_tests, recorder
from grail.components.tracking.component import finish_tracking, start_tracking

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [start_tracking, finish_tracking]
)


def test_a_run_is_checked_before_any_stage(tmp_path):
    """The fault probe's cases, refused by the first task instead of the stage that reads them
    (`--run-name '../../../escape2'` used to be refused only at export, after clean, training
    and the benchmark had run): one line naming the value."""
    import pytest
    from grail.components.tracking.task import check_run

    from grail.core.errors import GrailError

    recipe, issues, algorithms = "tiny/config_{algorithm}.yaml", ["gun_control"], ["grpo"]
    good = {"checkpoint_uri": "s3://b/ckpt", "export_destination": "s3://b/x", "run_name": "r1"}
    check_run(recipe, "{}", issues, algorithms, good)
    bad = [
        ('{"beta": -1}', {}, "with recipe_overrides: beta must be >= 0"),
        ('{"lerning_rate": 1}', {}, "unknown recipe key 'lerning_rate'"),
        ('{"reward_funcs": ["nope"]}', {}, "reward_funcs: unknown reward 'nope'"),
        ("[1]", {}, "recipe_overrides must be a JSON object"),
        ("{}", {"run_name": "../../../escape2"}, "run_name '../../../escape2'"),
        ("{}", {"checkpoint_key": ".."}, "checkpoint_key '..'"),
        ("{}", {"export_destination": "s3://exp/a/../../b"}, "a '..' segment in the key"),
        ("{}", {"checkpoint_uri": "s3://b//abs"}, "a key starting with '/' is refused"),
    ]
    for overrides, places, message in bad:
        with pytest.raises(GrailError, match=message.replace("(", r"\(").replace("[", r"\[")):
            check_run(recipe, overrides, issues, algorithms, good | places)


def test_the_start_task_opens_the_run_then_lists_every_branch(monkeypatch):
    """open_run checks and opens through start (places included) and returns the branches."""
    from grail.components.tracking import task

    fake = recorder("parent-7")
    monkeypatch.setattr(task, "start", fake)
    places = {
        "checkpoint_uri": "s3://b/c",
        "checkpoint_key": "",
        "export_destination": "",
        "run_name": "r",
    }
    parent, branches = task.open_run(
        experiment="exp",
        recipe="r.yaml",
        recipe_overrides="{}",
        issues=["gun_control", "minimum_wage"],
        algorithms=["grpo", "grail"],
        tiny_model=True,
        kfp_run_id="kfp-1",
        image="img",
        places=places,
        task="slate",
    )
    assert fake.calls == [
        (
            (),
            {
                "experiment": "exp",
                "recipe": "r.yaml",
                "kfp_run_id": "kfp-1",
                "image": "img",
                "algorithms": ["grpo", "grail"],
                "issues": ["gun_control", "minimum_wage"],
                "tiny": True,
                "overrides": "{}",
                "places": places,
                "task": "slate",
            },
        )
    ]
    assert parent == "parent-7" and len(branches) == 4
    assert {(b["issue"], b["algorithm"]) for b in branches} == {
        (i, a) for i in ("gun_control", "minimum_wage") for a in ("grpo", "grail")
    }
