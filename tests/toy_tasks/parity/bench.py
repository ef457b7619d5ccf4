"""The parity task's benchmark: the trained model, its step 0 and always-even, each asked the
validation numbers greedily; scored by accuracy."""

import json
from pathlib import Path

import pyarrow.parquet as pq

from grail.core.outputs import atomic_folder
from grail.inference.specs import run_markers
from toy_tasks.parity.toy import question, truth

FIELDS = ("accuracy",)


def replies(model_path: str, numbers: list[int], max_new_tokens: int) -> list[str]:
    """A model's greedy reply to each number's question."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    texts = []
    for n in numbers:
        text = tokenizer.apply_chat_template(
            question(n), add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip())
    return texts


def run(config, prompt, label, trained, branch):
    """Score the models on the validation numbers; metrics.json and report.md into config.out."""
    rows = pq.read_table(Path(config.data) / "validation.parquet").to_pylist()
    numbers = [r["n"] for r in rows[: config.limit or None]]

    def accuracy(answers):
        return sum(a == truth(n) for a, n in zip(answers, numbers, strict=True)) / len(numbers)

    tokens = (prompt or {}).get("max_new_tokens") or 4
    systems = {trained: {"accuracy": accuracy(replies(config.models[0], numbers, tokens)),
                         "step": "final"}}  # fmt: skip
    if config.start_model:
        systems[f"{trained}@0"] = {
            "accuracy": accuracy(replies(config.start_model, numbers, tokens)),
            "step": 0,
        }
    systems["always_even"] = {"accuracy": accuracy(["even"] * len(numbers)), "baseline": True}
    result = {
        "task": "parity",
        "trained": trained,
        "label": label,
        "branch": branch,
        "rows": len(numbers),
        "systems": systems,
        "runs": run_markers(config.models),
    }  # fmt: skip  (export pairs a run by them)
    lines = [f"| {name} | {entry['accuracy']:.3f} |" for name, entry in systems.items()]
    with atomic_folder(config.out, "benchmark") as out:  # finished, as every benchmark's is
        (out / "metrics.json").write_text(json.dumps(result, indent=1))
        report = "| system | accuracy |\n|---|---|\n" + "\n".join(lines) + "\n"
        (out / "report.md").write_text(report)
    return result


def metrics(result, trained):
    """[(key, value, step)]: the trained model's, its step 0's and the baseline's accuracy."""
    out = []
    for name, entry in result["systems"].items():
        if name == trained:
            out.append(("trained/accuracy", entry["accuracy"], 0))
        elif entry.get("step") == 0:
            out.append(("start/accuracy", entry["accuracy"], 0))
        else:
            out.append((f"baseline/{name}/accuracy", entry["accuracy"], 0))
    return out


def headline(result, trained):
    systems = result["systems"]
    out = {"accuracy": systems[trained]["accuracy"], "best_baseline": "always_even",
           "best_baseline_accuracy": systems["always_even"]["accuracy"]}  # fmt: skip
    if f"{trained}@0" in systems:
        out["start_accuracy"] = systems[f"{trained}@0"]["accuracy"]
    return out


def closing_table(rows, comparison):
    lines = ["subject    algorithm  accuracy  step 0  always-even"]
    for r in rows:
        lines.append(f"{r.get('issue', ''):<10} {r.get('algorithm', ''):<10} "
                     f"{r['accuracy']:<9.3f} {r.get('start_accuracy', float('nan')):<7.3f} "
                     f"{r['best_baseline_accuracy']:.3f}")  # fmt: skip
    return "\n".join(lines)
