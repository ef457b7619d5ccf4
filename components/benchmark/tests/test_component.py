"""The benchmark component on its own: the shared checks (tests/component_checks.py) and its
body's task with fakes in place of KFP's artifacts and of the stage."""

from pathlib import Path

from component_checks import FakeArtifact, FakeMetrics, folder_tests
from grail.components.benchmark.component import benchmark

test_readme, test_args, test_metadata, test_one_call, test_task_call = folder_tests(
    __file__, [benchmark]
)


def test_its_task_fills_results_report_and_charts(tmp_path, monkeypatch):
    """run_benchmark passes the tiny policy only with tiny_model, copies the report and puts
    every chart on one page."""
    from grail.components.benchmark import task

    def fake_benchmark(**args):
        out = Path(args["out"])
        out.mkdir()
        (out / "report.md").write_text("# Benchmark")
        (out / "a.svg").write_text("<svg>a</svg>")
        (out / "b.svg").write_text("<svg>b</svg>")
        fake_benchmark.args = args
        return {"trained/accuracy": 0.5}

    monkeypatch.setattr(task, "benchmark_task", fake_benchmark)
    for tiny, base in ((True, str(tmp_path / "base")), (False, "")):
        folder = tmp_path / str(tiny)
        folder.mkdir()
        data, model, base_models = (
            FakeArtifact("d"),
            FakeArtifact("m"),
            FakeArtifact(tmp_path / "base"),
        )
        results, report, charts = (
            FakeArtifact(folder / n) for n in ("results", "report", "charts")
        )
        metrics = FakeMetrics()
        task.run_benchmark(
            dataset=data,
            model=model,
            base_models=base_models,
            tiny_model=tiny,
            issue="gun_control",
            algorithm="grpo",
            reference_models="[]",
            limit=4,
            reads_rows=3,
            max_new_tokens=0,
            parent_run="p",
            results=results,
            report=report,
            charts=charts,
            metrics=metrics,
            task="slate",
        )
        assert fake_benchmark.args == {
            "dataset": "d",
            "model": "m",
            "base_models": base,
            "issue": "gun_control",
            "algorithm": "grpo",
            "references": "[]",
            "limit": 4,
            "reads_rows": 3,
            "max_new_tokens": 0,
            "parent": "p",
            "out": results.path,
            "task": "slate",
        }
        assert Path(report.path).read_text() == "# Benchmark"
        assert Path(charts.path).read_text() == "<html><body><svg>a</svg><svg>b</svg></body></html>"
        assert metrics.logged == {"trained/accuracy": 0.5}
