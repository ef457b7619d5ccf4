"""A user-defined reward, imported by dotted path in test_rewards."""


def double(prompts, completions, **_):
    return [2.0 for _ in completions]
