"""grail: RL-trained LLM "viewers" that predict which video a person clicks from a slate.

Stages (each a module, a `grail <stage>` subcommand, and a KFP component):
simulate/clean -> generate -> train -> benchmark -> export. See README.md.
"""

__version__ = "0.1.0"
