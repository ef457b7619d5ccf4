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

With ``--rl grpo grail``, RL on the policy that reads: the production train stage (``grail
train``'s, through ``recipes/tiny/config_{grpo,grail}.yaml``) from the same warmed-up policy, its
cloning (``--set`` applies) as step 0, then ``--rl-steps`` RL steps; each line says what RL added
beyond the cloned model, paired on the same rows, with its participant-bootstrap interval, and
the RL signal line (how many of the last step's groups had no spread in reward).

Run: ``.venv/bin/python bench/learnability.py [--rungs marker side study] [--sizes demo large]
[--rl grpo grail] [--out learnability_outputs]`` (about 15 minutes on 2 cores with the
defaults, without --rl, when the large size cloned its first 1,024 rows; every row now, 4
times the large size's cloning steps). What read best on L0: ``--set sft_batch_size=16
sft_num_train_epochs=4 sft_option_score_weight=1`` with ``sft_learning_rate=4e-3`` at the
demo's size (57-80%), ``2e-3`` at the large one (97-99%; docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from recipe_overrides import add_set_option, as_argv

from grail.benchmark.stage import run as benchmark
from grail.clean.stage import clean
from grail.tasks.slate.baselines import EXPECTED_CEILING
from grail.tasks.slate.benchmark.report import reads_cell
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
# the cloning clones every train row of the rung (the tiny recipe caps it at the demo's 1,024,
# which would clone a quarter of the large size's); --set sft_max_train_rows=N caps it again
EVERY_ROW = ["--sft_max_train_rows", "1000000"]


def study(out: Path, rung: str, participants: int) -> Path:
    """The rung's study, cleaned as the demo cleans (0.4 held out), its gun-control rows."""
    if not (out / "gun").is_dir():
        simulate(out / "raw", participants=participants, seed=7, choices=rung)
        clean(out / "raw", out / "clean", validation_fraction=0.4)
        issue_subset(out / "clean", ISSUE, out / "gun")
    return out / "gun"


def cloned(
    data: Path, out: Path, recipe: str, settings: list[str], reading: float, shape: list[str]
) -> tuple[Path, float, int]:
    """The tiny policy built from `data` (its warm-up reading the prompts at weight `reading`)
    and cloned by `recipe`; returns its folder, the seconds both took and the cloning's
    steps."""
    started = time.perf_counter()
    policy = out / "policy"
    if not policy.is_dir():
        sizes = {key: int(value) for key, _, value in (pair.partition("=") for pair in shape)}
        build_tiny_model(
            policy, data=data, format_warmup=TINY_WARMUP, warmup_prompt_weight=reading, **sizes
        )
    argv = ["--config", recipe, "--dataset", str(data), "--model_name_or_path", str(policy)]
    argv += ["--output_dir", str(out / "bc"), "--report_to", "none", "--disable_tqdm", "true"]
    argv += EVERY_ROW + as_argv(settings)
    model = Path(sft_warm_start(*parse_train_args(argv)))
    record = json.loads((model / "cloning.json").read_text())
    return model, time.perf_counter() - started, record["steps"]


def reinforced(
    data: Path, out: Path, algorithm: str, policy: Path, settings: list[str], steps: int
) -> tuple[Path, float]:
    """The production train stage from `policy`: its cloning (`settings` apply) as step 0,
    then `steps` steps of the tiny `algorithm` recipe; returns its folder and seconds."""
    from grail.train.stage import run as train

    started, where = time.perf_counter(), out / algorithm
    recipe = ROOT / "recipes" / "tiny" / f"config_{algorithm}.yaml"
    argv = ["--config", str(recipe), "--dataset", str(data), "--model_name_or_path", str(policy)]
    argv += ["--output_dir", str(where), "--max_steps", str(steps), "--save_steps", str(steps)]
    argv += ["--report_to", "none", "--disable_tqdm", "true", *EVERY_ROW, *as_argv(settings)]
    if not (where / "summary.json").is_file():
        train(*parse_train_args(argv))
    return where, time.perf_counter() - started


def rl_row(rung: str, size: str, algorithm: str, run: Path, data: Path, args) -> list[str]:
    """One line of the RL table: the cloned step 0, the last RL step, their paired difference,
    the signal line, and whether the last step reads."""
    result = benchmark(
        data, run.parent / f"benchmark-{algorithm}", models=[str(run)], limit=args.rows,
        reads_rows=args.reads_rows, trained=run.name,
    )  # fmt: skip
    series = {s["step"]: s for s in result["systems"].values() if s.get("series") == run.name}
    start, final = series[0], series[max(series)]
    added = result["differences"]["final_minus_start"]["log_loss"]
    signal = (result.get("training") or {}).get(run.name, {}).get("rl_signal") or "–"
    return [
        f"{RUNGS[rung]} {rung}",
        size,
        algorithm,
        str(max(series)),
        cell(start),
        cell(final),
        f"{added['difference']:+.3f} [{added['ci'][0]:+.3f}, {added['ci'][1]:+.3f}]",
        "–" if final.get("score_vs_prior") is None else f"{final['score_vs_prior']:.1f}",
        reads_cell(final, "options"),
        signal,
    ]


def cell(entry: dict, key: str = "log_loss") -> str:
    if entry.get(key) is None:
        return "–"
    low, high = entry.get(f"{key}_ci") or (None, None)
    return f"{entry[key]:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low is not None else "")


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
        reads_cell(policy, "viewer"),
        reads_cell(policy, "options"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rungs", nargs="+", default=list(RUNGS), choices=list(RUNGS))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "tiny" / "config_bc.yaml"))
    add_set_option(parser)
    parser.add_argument(
        "--shape", nargs="*", action="extend", default=[], metavar="KEY=N",
        help="the tiny policy's shape: hidden_size=, layers=, heads= (grail tiny-model's)",
    )  # fmt: skip
    parser.add_argument(
        "--reading",
        type=float,
        default=1.0,
        help="the warm-up's weight on the prompts read as a language model (0: the demo's)",
    )
    parser.add_argument("--rows", type=int, default=600, help="validation rows scored")
    parser.add_argument("--reads-rows", type=int, default=300, help="rows asked again")
    parser.add_argument(
        "--rl", nargs="*", default=[], choices=["grpo", "grail"],
        help="RL from the same policy (the train stage: cloning, then RL), paired to its cloning",
    )  # fmt: skip
    parser.add_argument("--rl-steps", type=int, default=40, help="RL steps after the cloning")
    parser.add_argument("--out", default="learnability_outputs")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    header = [
        "rung", "size", "train rows", "always-first", "ranker", "cloned policy", "ceiling",
        "policy's normalised score", "ranker's", "policy reads the viewer", "the options",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rl_header = [
        "rung", "size", "RL", "steps", "cloned (step 0)", "after RL", "RL minus cloned",
        "normalised score after RL", "reads the options after RL", "RL signal",
    ]  # fmt: skip
    timings, rl_lines = [], []
    for rung in args.rungs:
        for size in args.sizes:
            where = out / f"{rung}-{size}"
            data = study(where, rung, SIZES[size])
            model, seconds, steps = cloned(
                data, where, args.recipe, args.set, args.reading, args.shape
            )
            lines.append("| " + " | ".join(rung_row(rung, size, data, model, where, args)) + " |")
            timings.append(f"{rung}/{size}: {steps} cloning steps, {seconds:.0f} s")
            print(lines[-1], flush=True)
            for algorithm in args.rl:
                run, seconds = reinforced(
                    data, where, algorithm, where / "policy", args.set, args.rl_steps
                )
                rl_lines.append(
                    "| " + " | ".join(rl_row(rung, size, algorithm, run, data, args)) + " |"
                )
                timings.append(f"{rung}/{size}/{algorithm}: {seconds:.0f} s")
                print(rl_lines[-1], flush=True)
    print("\n".join(lines))
    if rl_lines:
        print("\n".join(["", "| " + " | ".join(rl_header) + " |", "|" + "---|" * len(rl_header)]
                        + rl_lines))  # fmt: skip
    print(
        f"\nlog-loss of the chosen video on {args.rows} validation rows (95% participant-"
        f"bootstrap intervals); normalised score: % of always-first's gap to the ceiling "
        f"closed (expected log-loss); reads: log-loss with the viewer / the options swapped "
        f"minus as shown on {args.reads_rows} rows. Policy shape: "
        f"{' '.join(args.shape) or 'the demo'}; warm-up reading {args.reading}; recipe "
        f"{args.recipe} {' '.join(args.set)}; " + "; ".join(timings)
    )


if __name__ == "__main__":
    main()
