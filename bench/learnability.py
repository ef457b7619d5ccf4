"""The learnability ladder: can the embedded policy learn to read at all, and where does it stop?

Three synthetic studies, from trivially learnable to the demo's (``grail simulate --choices``):

- L0 ``marker``: every slate has one option whose title opens with ``Featured:``; people choose
  it with probability 0.9 wherever it stands (one lookup: a word);
- L1 ``side``: the viewer's party against each video's side (one viewer field crossed with one
  word of each option: its channel), nothing else, no position effect;
- L2 ``study``: the demo's study (stance against slant, momentum, popularity, position).

Each rung at the demo's train size (1,500 participants, 0.4 held out: about 810 gun-control
train rows) and at about 4,000 train rows (``--large``). On each: always-first, the ranker, the
cloned policy and the ceiling (the study's own choice model), log-loss with 95%
participant-bootstrap intervals, the cloned policy's normalised score (the share of
always-first's gap to the ceiling it closes) and whether it reads (log-loss with the viewer,
then the options, swapped, minus as shown). The policy is built and cloned the production way:
the tiny-models task's policy (:func:`grail.train.tiny.build_tiny_model`, its format warm-up,
reading the prompts as a language model at ``--reading``, 1.0: without it nothing is learned)
cloned by ``recipes/tiny/config_bc.yaml`` through :func:`grail.train.sft.sft_warm_start`
(``--recipe`` and ``--set key=value`` change it), scored by ``grail benchmark``'s stage.

Run: ``.venv/bin/python bench/learnability.py [--rungs marker side study] [--sizes demo large]
[--out learnability_outputs]`` (about 15 minutes on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from grail.benchmark.stage import run as benchmark
from grail.clean.stage import clean
from grail.tasks.slate.baselines import EXPECTED_CEILING
from grail.tasks.slate.contract import issue_subset
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.warmup import STEPS as TINY_WARMUP
from grail.train.config import parse_train_args
from grail.train.sft import sft_warm_start
from grail.train.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
RUNGS = {"marker": "L0", "side": "L1", "study": "L2"}
# participants over the three studies: the demo's 1,500, and about 4,000 gun-control train rows
SIZES = {"demo": 1500, "large": 7500}
ISSUE = "gun_control"


def study(out: Path, rung: str, participants: int) -> Path:
    """The rung's study, cleaned as the demo cleans (0.4 held out), its gun-control rows."""
    if not (out / "gun").is_dir():
        simulate(out / "raw", participants=participants, seed=7, choices=rung)
        clean(out / "raw", out / "clean", validation_fraction=0.4)
        issue_subset(out / "clean", ISSUE, out / "gun")
    return out / "gun"


def cloned(
    data: Path, out: Path, recipe: str, settings: list[str], reading: float
) -> tuple[Path, float, int]:
    """The tiny policy built from `data` (its warm-up reading the prompts at weight `reading`)
    and cloned by `recipe`; returns its folder, the seconds both took and the cloning's
    steps."""
    started = time.perf_counter()
    policy = out / "policy"
    if not policy.is_dir():
        build_tiny_model(policy, data=data, format_warmup=TINY_WARMUP, warmup_prompt_weight=reading)
    argv = ["--config", recipe, "--dataset", str(data), "--model_name_or_path", str(policy)]
    argv += ["--output_dir", str(out / "bc"), "--report_to", "none", "--disable_tqdm", "true"]
    for pair in settings:
        key, _, value = pair.partition("=")
        argv += [f"--{key}", value]
    model = Path(sft_warm_start(*parse_train_args(argv)))
    record = json.loads((model / "cloning.json").read_text())
    return model, time.perf_counter() - started, record["steps"]


def cell(entry: dict, key: str = "log_loss") -> str:
    if entry.get(key) is None:
        return "–"
    low, high = entry.get(f"{key}_ci") or (None, None)
    return f"{entry[key]:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low is not None else "")


def reads(entry: dict, name: str) -> str:
    if entry.get(f"reads_{name}") is None:
        return "–"
    low, high = entry[f"reads_{name}_ci_low"], entry[f"reads_{name}_ci_high"]
    return f"{entry[f'reads_{name}']:+.3f} [{low:+.3f}, {high:+.3f}]"


def rung_row(rung: str, size: str, data: Path, model: Path, out: Path, args) -> list[str]:
    """One line of the table: the rung's references and the cloned policy."""
    from grail.tasks.slate.contract import read_dataset

    prompt = json.loads((model / "prompt.json").read_text())
    result = benchmark(
        data, out / "benchmark", models=[str(model)], limit=args.rows, prompt=prompt,
        reads_rows=args.reads_rows,
    )  # fmt: skip
    systems = result["systems"]
    policy = systems[model.name]
    train = read_dataset(data, split="train").num_rows
    return [
        f"{RUNGS[rung]} {rung}",
        size,
        str(train),
        cell(systems["always_first"]),
        cell(systems["ranker"]),
        cell(policy),
        cell(systems[EXPECTED_CEILING]),
        "–" if policy.get("score_vs_prior") is None else f"{policy['score_vs_prior']:.1f}",
        f"{systems['ranker'].get('score_vs_prior', 0):.1f}",
        reads(policy, "viewer"),
        reads(policy, "options"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rungs", nargs="+", default=list(RUNGS), choices=list(RUNGS))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "tiny" / "config_bc.yaml"))
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="cloning recipe overrides"
    )
    parser.add_argument(
        "--reading",
        type=float,
        default=1.0,
        help="the warm-up's weight on the prompts read as a language model (0: the demo's)",
    )
    parser.add_argument("--rows", type=int, default=600, help="validation rows scored")
    parser.add_argument("--reads-rows", type=int, default=300, help="rows asked again")
    parser.add_argument("--out", default="learnability_outputs")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    header = [
        "rung", "size", "train rows", "always-first", "ranker", "cloned policy", "ceiling",
        "policy's normalised score", "ranker's", "policy reads the viewer", "the options",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    timings = []
    for rung in args.rungs:
        for size in args.sizes:
            where = out / f"{rung}-{size}"
            data = study(where, rung, SIZES[size])
            model, seconds, steps = cloned(data, where, args.recipe, args.set, args.reading)
            lines.append("| " + " | ".join(rung_row(rung, size, data, model, where, args)) + " |")
            timings.append(f"{rung}/{size}: {steps} cloning steps, {seconds:.0f} s")
            print(lines[-1], flush=True)
    print("\n".join(lines))
    print(
        f"\nlog-loss of the chosen video on {args.rows} validation rows (95% participant-"
        f"bootstrap intervals); normalised score: % of always-first's gap to the ceiling "
        f"closed (expected log-loss); reads: log-loss with the viewer / the options swapped "
        f"minus as shown on {args.reads_rows} rows. Warm-up reading {args.reading}; recipe "
        f"{args.recipe} {' '.join(args.set)}; " + "; ".join(timings)
    )


if __name__ == "__main__":
    main()
