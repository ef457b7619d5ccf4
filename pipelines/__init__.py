"""Every task's DAG (dag.py around pipeline.py) and their compiled IR (grail.yaml,
summarize.yaml), installed as grail.pipelines."""
