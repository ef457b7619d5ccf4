"""The parity task's study, cleaning, training examples, rewards, tiny model and notes."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from grail.core.rewards import completion_text
from grail.core.run_notes import Notes
from grail.core.warmup import teach_replies
from grail.tasks import Dag, Parameter

NONE = None  # no comparison of algorithms, counterfactual sessions or generate stage
NO_OPTIONS = None  # a number, no options: no recipe fields, prompt, audit, GRAIL or cloning
ANSWER_SAMPLES = ["even", "odd"]
TARGETS = ("uniform",)
STEPS = 20
GAIL = False
TRAINS_WITH_API = False
SUBJECT_NAMES = {}
HERE = Path(__file__).parent
EMBEDDED = {
    "recipe": str(HERE / "config_{algorithm}.yaml"),
    "algorithms": ["grpo"],
    "max_steps": 2,
    "mlflow_experiment": "parity-local",
    "folder": "parity-",
}


def question(n: int) -> list[dict]:
    return [{"role": "user", "content": f"Is {n} even or odd?"}]


def truth(n: int) -> str:
    return "even" if n % 2 == 0 else "odd"


def simulate(out, participants, documents, seed, layout, choices="study"):
    """`documents` numbers (0: 60), drawn from the seed."""
    import random

    draw = random.Random(seed)
    numbers = [draw.randrange(1000) for _ in range(documents or 60)]
    Path(out).mkdir(parents=True)
    (Path(out) / "numbers.json").write_text(json.dumps(numbers))
    return [f"wrote {len(numbers)} numbers to {out}"]


def clean(raw, out, config):
    numbers = json.loads((Path(raw) / "numbers.json").read_text())
    Path(out).mkdir(parents=True, exist_ok=True)
    rows = [{"n": n, "split": "validation" if k % 4 == 0 else "train"}
            for k, n in enumerate(numbers)]  # fmt: skip
    for split in ("train", "validation"):
        part = [r for r in rows if r["split"] == split]
        pq.write_table(pa.Table.from_pylist(part), Path(out) / f"{split}.parquet")
    audit = {"task": "parity", "rows": len(rows)}
    (Path(out) / "audit.json").write_text(json.dumps(audit))
    return audit


def cleaned(report, out):
    return f"{report['rows']} numbers in {out}"


def audit_markdown(report):
    return f"# Parity\n\n{report['rows']} numbers\n"


def audit_counts(report):
    return {"rows": report["rows"]}


def clean_params(config, participants, documents):
    return {"synthetic": documents}


def branch_subjects(issues):
    return ["numbers"]


def parity_reward(prompts, completions, n, **_):
    return [
        float(completion_text(c).strip() == truth(k)) for c, k in zip(completions, n, strict=True)
    ]


REWARDS = {"parity": parity_reward}
DEFAULT_REWARDS = ["parity"]
REWARD_NOTES = {"parity": "1 when the answer is the number's parity (optimal: right)"}


def check_training(fields):
    if fields.gail_use:
        raise ValueError("gail_use: the parity task has no discriminator")


def check_benchmark(config):
    """The toy has no benchmark options of its own."""


def examples(config, folder, split, limit):
    rows = pq.read_table(Path(folder) / f"{split}.parquet").to_pylist()[:limit]
    return [{"prompt": question(r["n"]), "n": r["n"]} for r in rows]


def prompt_record(config):
    return {"max_new_tokens": config.max_completion_length}


def before_training(config, weights, dataset):
    return None


def conversations(data, limit=3000):
    rows = pq.read_table(Path(data) / "train.parquet").to_pylist()[:limit]
    return [[*question(r["n"]), {"role": "assistant", "content": truth(r["n"])}] for r in rows]


def warm_up(model, tokenizer, chats, steps, seed, data, target, prompt_weight=0.0):
    return teach_replies(model, tokenizer, chats, steps, seed, prompt_weight=prompt_weight)


def tracked_rows(path, issue):
    return pq.read_table(path).to_pandas(), None


def branch_rows(dataset, issue, scratch):
    return dataset, "the validation numbers"


def embedded_arguments(config):
    return {"documents": config.documents}


def row(values, issue, algorithm, experiment_id, bench):
    return f"| {issue} | {algorithm} | {values.get('accuracy', '-')} |"


NOTES = Notes(("accuracy", "start_accuracy"), ("| subject | algorithm | accuracy |",
              "|---|---|---|"), row, "No intervals.")  # fmt: skip


def version_story(summary, issue, algorithm, run, fingerprint, sources):
    return f"{algorithm} on {issue}: accuracy {summary.get('accuracy')}", {"task": "parity"}


def promotion(summary):
    accuracy, best = summary.get("accuracy", 0.0), summary.get("best_baseline_accuracy", 1.0)
    if accuracy > best:
        return True, f"accuracy {accuracy:.3f} beats always-even's {best:.3f}"
    return False, f"accuracy {accuracy:.3f}, no better than always-even's {best:.3f}"


def clean_inputs(params):
    return {
        "raw_uri": params["raw_uri"],
        "participants": 0,
        "seed": params["seed"],
        "validation_fraction": 0.0,
        "documents": params["documents"],
        "validation_documents": 1,
    }  # fmt: skip (the toy splits by itself)


DAG = Dag(
    name="grail-parity",
    file="parity.yaml",
    description="A toy task: is the number even or odd?",
    parameters=(Parameter("documents", int, 0, "Numbers in the simulated study (0 = 60)."),),
    defaults={"recipe": (EMBEDDED["recipe"], "The parity recipe; {algorithm} is filled in.")},
    clean_inputs=clean_inputs,
)
