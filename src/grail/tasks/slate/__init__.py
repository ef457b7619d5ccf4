"""The slate task: which video a person clicks next from a recommendation slate (the GRAIL
study, PNAS 2025).

- :mod:`~grail.tasks.slate.policy_issues`: the study's two political issues and their names;
- :mod:`~grail.tasks.slate.simulate` (with :mod:`~grail.tasks.slate.world` and
  :mod:`~grail.tasks.slate.people`), :mod:`~grail.tasks.slate.tables`,
  :mod:`~grail.tasks.slate.capsule_study`: the synthetic study with a known choice model, in
  grail's raw layout or the published capsule's (:mod:`~grail.tasks.slate.study`: either);
- :mod:`~grail.tasks.slate.raw`, :mod:`~grail.tasks.slate.capsule`: reading either raw layout;
- :mod:`~grail.tasks.slate.contract`: the cleaned dataset's columns and their checks;
- :mod:`~grail.tasks.slate.audit`: position baselines and leakage detectors;
- :mod:`~grail.tasks.slate.prompts`: the prompt and the answer format;
- :mod:`~grail.tasks.slate.rewards`: accuracy, format, opinion and the proper scoring rules;
- :mod:`~grail.tasks.slate.examples`, :mod:`~grail.tasks.slate.warmup`: the training prompts
  and the tiny model's text and format warm-up;
- :mod:`~grail.tasks.slate.cloning`, :mod:`~grail.tasks.slate.discriminator`: behaviour
  cloning's replies, and what GRAIL's discriminator reads of a choice;
- :mod:`~grail.tasks.slate.baselines`, :mod:`~grail.tasks.slate.metrics`: the benchmark's
  baselines and its simulator scores;
- :mod:`~grail.tasks.slate.benchmark`: the task's benchmark (systems, scores, report, records,
  the comparison of algorithms), which the benchmark stage runs;
- :mod:`~grail.tasks.slate.counterfactual`: sessions under recommenders the simulators never
  saw (``grail counterfactual``).
"""

PARTS = {  # grail.tasks.PARTS: where each part of every task lives in this folder
    "simulate": "study:write_study",
    "recipe_fields": "prompts:PromptOptions",
    "show_prompt": "examples:shown_prompt",
    "audit": "audit:audit_text",
    "check_benchmark": "examples:check_benchmark",
    "policy_reward": "rewards:PolicyScoreReward",
    "cloning_examples": "cloning:cloned_choices",
    "cloning_answer": "cloning:longest_answer",
    "reply_choice": "rewards:parse_answer",
    "discriminator_text": "discriminator:choice_text",
    "discriminator_features": "discriminator:crossed_features",
    "counterfactual_config": "counterfactual.config:CounterfactualConfig",
    "clean": "clean:clean",
    "cleaned": "clean:cleaned",
    "audit_markdown": "clean:audit_markdown",
    "audit_counts": "clean:audit_counts",
    "clean_params": "clean:clean_params",
    "branch_subjects": "examples:branch_subjects",
    "rewards": "rewards:REWARDS",
    "default_rewards": "rewards:DEFAULT_REWARDS",
    "reward_notes": "rewards:REWARD_NOTES",
    "check_training": "examples:check_training",
    "examples": "examples:examples",
    "prompt_record": "examples:prompt_record",
    "before_training": "rewards:warn_mode_seeking",
    "warmup_conversations": "warmup:conversations",
    "warm_up": "warmup:warm_up",
    "answer_samples": "warmup:ANSWER_SAMPLES",
    "warmup_targets": "warmup:TARGETS",
    "warmup_steps": "warmup:STEPS",
    "gail": "examples:GAIL",
    "tracked_rows": "examples:tracked_rows",
    "branch_rows": "examples:branch_rows",
    "embedded": "embedded:DEFAULTS",
    "embedded_arguments": "embedded:arguments",
    "notes": "notes:NOTES",
    "version_story": "notes:version_story",
    "promotion": "notes:promotion",
    "trains_with_api": "examples:TRAINS_WITH_API",
    "benchmark": "benchmark.run:run",
    "benchmark_metrics": "benchmark.records:stable_metrics",
    "benchmark_fields": "benchmark.records:SUMMARY_FIELDS",
    "headline": "benchmark.records:benchmark_headline",
    "closing_table": "benchmark.closing:closing_table",
    "compare": "benchmark.compare:run",
    "compare_headline": "benchmark.compare:compare_headline",
    "counterfactual": "counterfactual.stage:run",
    "generation": "generation:GENERATION",
    "dag": "dag:DAG",
    "subject_names": "policy_issues:SUBJECT_NAMES",
    "counterfactual_branch": "counterfactual.branch:branch_sessions",
}
