"""A user-defined reward, imported by dotted path in test_rewards."""


def double(prompts, completions, **_):
    return [2.0 for _ in completions]


def nothing_to_learn(prompts, completions, **_):
    """The same reward for every completion: GRPO's advantages are all 0."""
    return [0.0 for _ in completions]
