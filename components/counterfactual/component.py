"""KFP component for stage counterfactual: a branch's trained simulator drives sessions under
other recommenders, scored against the synthetic study's known truth, and replays the slates
people were shown, scored against people's sessions."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from grail.core.images import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def counterfactual(
    dataset: Input[Dataset],
    model: Input[Model],
    base_models: Input[Model],
    tiny_model: bool,
    issue: str,
    algorithm: str,
    recommenders: list,
    viewers: int,
    steps: int,
    seed: int,
    parent_run: str,
    outcomes: Output[Artifact],
    report: Output[Markdown],
    charts: Output[HTML],
    metrics: Output[Metrics],
):
    """Roll out the branch's trained model, its step 0, the baselines and the truth under
    every recommender, paired by viewer, on the issue's validation participants.

    Args:
        dataset: The cleaned study (the clean component's output; a synthetic one with its
            truth, else only the replayed arm runs, against people's sessions).
        model: The trained model (the train component's model).
        base_models: The tiny starting models (the tiny-models component's output).
        tiny_model: Simulate the tiny policy in base_models as step 0; otherwise the model
            the training run names in its summary, when it is a local folder.
        issue: The branch's issue (gun_control, minimum_wage): its viewers are sampled.
        algorithm: The branch's algorithm (grpo, grail, bc): the trained simulator's name.
        recommenders: The recommenders to roll out (factual, like_minded, cross_cutting,
            popularity, random, replayed).
        viewers: Validation participants of the issue.
        steps: Clicks per session.
        seed: Seed of the viewers, the slates and the clicks.
        parent_run: The pipeline's parent MLflow run ("" when tracking is off).
        outcomes: counterfactual.json, report.md and outcomes.svg.
        report: The report as Markdown, viewable in the Kubeflow UI.
        charts: The outcome chart as one page.
        metrics: The recommender effects' errors against the truth on the judged outcomes
            and the verdicts (cf/ISSUE/SIMULATOR/OUTCOME_error/EFFECT,
            cf/ISSUE/MODEL/OUTCOME_gap_vs_BASELINE/EFFECT; OUTCOME slant or opinion_shift,
            BASELINE position_prior or ranker); the like-minded click share on balanced
            slates the same way, EFFECT the recommender (random, factual); on the replayed
            arm, each simulator's
            difference from people and the verdicts against them
            (cf/ISSUE/SIMULATOR/OUTCOME_vs_people, cf/ISSUE/MODEL/OUTCOME_gap_vs_BASELINE/
            people; OUTCOME first_slot or popularity).
    """
    from grail.components.counterfactual.task import run_counterfactual

    run_counterfactual(
        dataset=dataset,
        model=model,
        base_models=base_models,
        tiny_model=tiny_model,
        issue=issue,
        algorithm=algorithm,
        recommenders=recommenders,
        viewers=viewers,
        steps=steps,
        seed=seed,
        parent_run=parent_run,
        outcomes=outcomes,
        report=report,
        charts=charts,
        metrics=metrics,
    )
