"""What a person starts: compile the DAG, run it locally (kfp.local), submit it, check a cluster."""
