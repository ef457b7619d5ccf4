"""The code that asks a model: local transformers or vLLM (tensor parallel where a model needs
several GPUs), an OpenAI-compatible API, the models a spec names; below the tasks, which hand
in their own prompts and reading rules."""
