"""What ``grail run --local`` prints of the slate task's branches: the closing table of their
benchmark headlines (the task's ``closing_table`` part), the position-prior verdict in words."""

from __future__ import annotations

from grail.tasks.headline import change, exported_line, number
from grail.tasks.slate.benchmark.reads import ABLATIONS
from grail.tasks.slate.benchmark.report import reads_cell

NO_WORSE = 0.005  # nats: a paired interval's upper bound this close to 0 is "no worse"


def prior_verdict(row: dict) -> str:
    """The first question, in words: is the final model better than always-first (the
    position prior) in log-loss? From the paired difference's 95% interval.

    >>> key = "final_minus_always_first/log_loss"
    >>> prior_verdict({f"{key}_ci_low": -0.03, f"{key}_ci_high": -0.01})
    'beats the position prior'
    >>> prior_verdict({f"{key}_ci_low": -0.01, f"{key}_ci_high": 0.004})
    'no worse than the position prior'
    >>> prior_verdict({f"{key}_ci_low": -0.01, f"{key}_ci_high": 0.02})
    'not shown to reach the position prior'
    >>> prior_verdict({f"{key}_ci_low": 0.01, f"{key}_ci_high": 0.05})
    'worse than the position prior'
    """
    key = "final_minus_always_first/log_loss"
    low, high = row.get(f"{key}_ci_low"), row.get(f"{key}_ci_high")
    if low is None or high is None:
        return ""
    if high < 0:
        return "beats the position prior"
    if low > 0:
        return "worse than the position prior"
    if high <= NO_WORSE:
        return "no worse than the position prior"
    return "not shown to reach the position prior"


def closing_table(rows: list[dict], comparison: dict | None = None) -> str:
    """Per issue and algorithm: the final model's accuracy, its log-loss against step 0's (the
    paired change with its participant-bootstrap interval: below 0 is better), the best
    baseline by accuracy, the ceiling (accuracy/log-loss) and a collapse flag; a line with its
    log-loss against always-first's, the position prior (paired likewise, and said in words:
    :func:`prior_verdict`); a line against the best baseline by log-loss; on a synthetic study a
    line with the expected log-loss (under the known choice model) and one with the normalised
    score (:func:`grail.tasks.slate.benchmark.scores.normalised_scores`); whether RL had
    signal, in words (:mod:`grail.train.rl_signal`); the promotion gate's decision
    (:func:`grail.export.promotion.in_words`); then per issue the differences between algorithms.

    >>> print(closing_table([{"issue": "gun_control", "algorithm": "grpo", "accuracy": 0.4,
    ...     "ci_low": 0.31, "ci_high": 0.5, "log_loss": 1.2, "start_log_loss": 1.38,
    ...     "final_minus_start/log_loss_difference": -0.18,
    ...     "final_minus_start/log_loss_ci_low": -0.25, "final_minus_start/log_loss_ci_high": -0.1,
    ...     "best_baseline": "ranker", "best_baseline_accuracy": 0.56,
    ...     "best_log_loss_baseline": "most_frequent_position",
    ...     "best_log_loss_baseline_log_loss": 1.19,
    ...     "final_minus_best_baseline/log_loss_difference": 0.01,
    ...     "final_minus_best_baseline/log_loss_ci_low": -0.02,
    ...     "final_minus_best_baseline/log_loss_ci_high": 0.04,
    ...     "final_minus_always_first/log_loss_difference": -0.02,
    ...     "final_minus_always_first/log_loss_ci_low": -0.04,
    ...     "final_minus_always_first/log_loss_ci_high": -0.01,
    ...     "ceiling_accuracy": 0.65, "ceiling_log_loss": 0.9, "score_vs_prior": 6.2,
    ...     "score_vs_uniform": 51.0, "rl_signal": "RL had signal: 3 of 64 groups had equal"
    ...     " rewards over 2 steps (mean within-group reward std 0.21); the policy writes no"
    ...     " thought", "promotion": "promoted (champion): beats always-first: log-loss -0.020"
    ...     " [-0.040, -0.010]"}]))
    issue          algorithm  accuracy [95% CI]     log-loss  step 0  change [95% CI]          best baseline     ceiling
    gun_control    grpo       0.400 [0.31, 0.50]    1.200     1.380   -0.180 [-0.250, -0.100]  ranker 0.560      0.650/0.900
                              vs always-first       1.200             -0.020 [-0.040, -0.010]  beats the position prior
                              vs best by log-loss   1.200             +0.010 [-0.020, +0.040]  most_frequent_position 1.190
                              normalised score      6.2                                        % of always-first's gap to the ceiling closed (51.0 of uniform's)
                              RL had signal: 3 of 64 groups had equal rewards over 2 steps (mean within-group reward std 0.21); the policy writes no thought
                              promoted (champion): beats always-first: log-loss -0.020 [-0.040, -0.010]
    """  # noqa: E501 (the table as printed)
    lines = [
        f"{'issue':<14} {'algorithm':<10} {'accuracy [95% CI]':<21} {'log-loss':<9} "
        f"{'step 0':<7} {'change [95% CI]':<24} {'best baseline':<17} ceiling"
    ]
    for r in rows:
        ci = f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if "ci_low" in r else ""
        base = (
            f"{r['best_baseline']} {r['best_baseline_accuracy']:.3f}"
            if "best_baseline" in r
            else "-"
        )
        ceiling = f"{number(r, 'ceiling_accuracy')}/{number(r, 'ceiling_log_loss')}"
        lines.append(
            f"{r['issue']:<14} {r.get('algorithm', ''):<10} {number(r, 'accuracy') + ci:<21} "
            f"{number(r, 'log_loss'):<9} {number(r, 'start_log_loss'):<7} "
            f"{change(r, 'log_loss'):<24} {base:<17} {ceiling}"
        )
        lines += row_details(r)
    for issue, entry in ((comparison or {}).get("issues") or {}).items():
        for label, difference in entry["differences"].items():
            cells = [
                f"{metric} {d['difference']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                for metric, d in difference.items()
            ]
            lines.append(f"{issue:<14} {label.replace('_minus_', '-'):<10} " + "; ".join(cells))
    return "\n".join(lines)


def row_details(r: dict) -> list[str]:
    """The lines under a closing-table row: the cloned warm start, the model against
    always-first and against the best baseline by log-loss, the expected log-loss, the
    normalised score, the RL signal and a collapse."""
    lines = []
    if r.get("cloned_log_loss") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'behaviour cloning':<21} {number(r, 'cloned_log_loss'):<9} "
            f"{'':<7} {'':<24} (the warm start RL continued from)"
        )
    if r.get("final_minus_always_first/log_loss_difference") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'vs always-first':<21} {number(r, 'log_loss'):<9} "
            f"{'':<7} {change(r, 'log_loss', 'always_first'):<24} {prior_verdict(r)}"
        )
    if r.get("best_log_loss_baseline"):
        lines.append(
            f"{'':<14} {'':<10} {'vs best by log-loss':<21} {number(r, 'log_loss'):<9} "
            f"{'':<7} {change(r, 'log_loss', 'best_baseline'):<24} "
            f"{r['best_log_loss_baseline']} {number(r, 'best_log_loss_baseline_log_loss')}"
        )
    if r.get("expected_log_loss") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'expected log-loss':<21} "
            f"{number(r, 'expected_log_loss'):<9} {number(r, 'start_expected_log_loss'):<7} "
            f"{change(r, 'expected_log_loss'):<24} (under the study's choice model)"
        )
    if r.get("score_vs_prior") is not None:
        lines.append(
            f"{'':<14} {'':<10} {'normalised score':<21} {r['score_vs_prior']:<9.1f} "
            f"{'':<7} {'':<24} % of always-first's gap to the ceiling closed "
            f"({number(r, 'score_vs_uniform', 1)} of uniform's)"
        )
    if r.get("reads_viewer") is not None or r.get("reads_options") is not None:
        lines.append(f"{'':<14} {'':<10} {reads_line(r)}")
    if r.get("rl_signal"):
        lines.append(f"{'':<14} {'':<10} {r['rl_signal']}")
    if r.get("collapsed"):
        lines.append(f"{'':<14} {'':<10} COLLAPSED: {r['collapsed']}")
    if r.get("exported_step") is not None:
        lines.append(f"{'':<14} {'':<10} {exported_line(r)}")
    if r.get("promotion"):
        lines.append(f"{'':<14} {'':<10} {r['promotion']}")
    return lines


def reads_line(r: dict) -> str:
    """Whether the final model reads, in one line: log-loss with the viewer's lines, then the
    options, swapped minus as shown (:mod:`grail.tasks.slate.benchmark.reads`), each with its
    interval, and the ranker's beside them for reference.

    >>> print(reads_line({"reads_viewer": 0.08, "reads_viewer_ci_low": 0.05,
    ...     "reads_viewer_ci_high": 0.11, "reads_options": 0.001, "reads_options_ci_low": -0.002,
    ...     "reads_options_ci_high": 0.004, "ranker_reads_viewer": 0.1,
    ...     "ranker_reads_viewer_ci_low": 0.07, "ranker_reads_viewer_ci_high": 0.13}))
    reads the viewer: +0.080 [+0.050, +0.110]; the options: no, +0.001 [-0.002, +0.004] (ranker: +0.100 [+0.070, +0.130], –)
    """  # noqa: E501 (the line as printed)
    said = []
    for name in ABLATIONS:
        cell = reads_cell(r, name)
        low = r.get(f"reads_{name}_ci_low")
        word = "" if low is None or low > 0 else "no, "
        said.append(f"{'reads the viewer' if name == 'viewer' else 'the options'}: {word}{cell}")
    ranker = {k[len("ranker_") :]: v for k, v in r.items() if k.startswith("ranker_reads_")}
    reference = ", ".join(reads_cell(ranker, name) for name in ABLATIONS)
    return "; ".join(said) + (f" (ranker: {reference})" if ranker else "")
