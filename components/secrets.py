"""Which Kubernetes secret keys become which environment variables, in the tasks' pods and in a
TrainJob's pods alike. Secret names are pipeline parameters; values never leave the cluster."""

S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
    "AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL",
}
MLFLOW_KEYS = {
    "MLFLOW_TRACKING_URI": "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_USERNAME": "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD": "MLFLOW_TRACKING_PASSWORD",
}
OPENAI_KEYS = {"OPENAI_API_KEY": "OPENAI_API_KEY"}
