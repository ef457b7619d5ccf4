"""The grail pipeline (pipelines/grail.py) and its compiled IR (grail.yaml)."""
