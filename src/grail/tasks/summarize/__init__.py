"""The summarize task: a model summarizes a document; a reader answers hidden questions from the
summary alone; the reward is how many it answers (OpenPipe's Summary-RL, on RepLiQA).

- :mod:`~grail.tasks.summarize.documents`: the synthetic study (fictional entities, known facts,
  five hidden questions per document) in RepLiQA's layout;
- :mod:`~grail.tasks.summarize.clean`: RepLiQA's layout -> one row per document, split by document;
- :mod:`~grail.tasks.summarize.prompt`: the prompt and answer format (extractive or abstractive,
  the budget stated);
- :mod:`~grail.tasks.summarize.reader`: the deterministic reader of the synthetic study;
- :mod:`~grail.tasks.summarize.baselines`: lead-k, random-k, TF-IDF centrality, the oracle and the
  full document;
- :mod:`~grail.tasks.summarize.metrics`: questions answered with document-bootstrap intervals,
  win rates, words, compression, faithfulness;
- :mod:`~grail.tasks.summarize.report`: the benchmark's report and closing table;
- :mod:`~grail.tasks.summarize.benchmark`: the task's benchmark, which runs models and these
  parts together (the benchmark stage calls it).
"""

PARTS = {  # grail.tasks.PARTS: where each part of every task lives in this folder
    "simulate": "documents:write_study",
    "recipe_fields": "examples:RECIPE_FIELDS",
    "show_prompt": "examples:SHOWN_PROMPT",
    "audit": "examples:AUDIT",
    "check_benchmark": "examples:check_benchmark",
    "policy_reward": "rewards:POLICY_REWARD",
    "cloning_examples": "examples:CLONING",
    "cloning_answer": "examples:CLONING",
    "reply_choice": "examples:DISCRIMINATOR",
    "discriminator_text": "examples:DISCRIMINATOR",
    "discriminator_features": "examples:DISCRIMINATOR",
    "counterfactual_config": "examples:COUNTERFACTUAL_CONFIG",
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
    "before_training": "examples:before_training",
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
    "benchmark": "benchmark:run",
    "benchmark_metrics": "benchmark:document_metrics",
    "benchmark_fields": "benchmark:SHOWN_FIELDS",
    "headline": "benchmark:documents_headline",
    "closing_table": "report:document_table",
    "compare": "benchmark:COMPARE",
    "compare_headline": "benchmark:COMPARE",
    "counterfactual": "benchmark:COUNTERFACTUAL",
    "generation": "generation:GENERATION",
    "dag": "dag:DAG",
    "subject_names": "examples:SUBJECT_NAMES",
    "counterfactual_branch": "benchmark:COUNTERFACTUAL",
}
