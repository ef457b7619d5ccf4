"""The grail DAG (pipeline.py) and its compiled IR (grail.yaml), installed as grail.pipelines."""
