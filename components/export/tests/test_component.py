"""The export component on its own: the shared checks (tests/component_checks.py) and its
body's task with fakes in place of KFP's artifacts and of the stage."""

from component_checks import FakeArtifact, FakeMetrics, folder_tests, recorder
from grail.components.export.component import export

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [export]
)


def test_its_task_keys_by_run_name_else_run_id_and_logs_file_counts(tmp_path, monkeypatch):
    """run_export exports under the run's name, or the KFP run id when it has none, and hands
    the promotion gate's decision on."""
    from grail.components.export import task

    fake = recorder({"uploaded": 4, "skipped": 1})
    monkeypatch.setattr(task, "export_task", fake)
    model, results, manifest, decision = (FakeArtifact(tmp_path / n) for n in ("m", "r", "x", "d"))
    for run_name, run in (("named", "named"), ("", "kfp-id")):
        metrics = FakeMetrics()
        task.run_export(
            model=model,
            results=results,
            destination="s3://b/e",
            run_name=run_name,
            kfp_run_id="kfp-id",
            issue="gun_control",
            algorithm="grpo",
            parent_run="p",
            manifest=manifest,
            metrics=metrics,
            decision=decision,
        )
        assert fake.calls[-1] == (
            (),
            {
                "model": model.path,
                "results": results.path,
                "destination": "s3://b/e",
                "run": run,
                "issue": "gun_control",
                "algorithm": "grpo",
                "parent": "p",
                "out": manifest.path,
                "decision": decision.path,
            },
        )
        assert metrics.logged == {"files_uploaded": 4, "files_skipped": 1}
