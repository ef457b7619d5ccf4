"""What every stage shares: errors, complete-or-absent outputs, storage, configuration and
recipes, tracking, the issues, the dataset contract, prompts and rewards, model endpoints,
images, checkpoints."""
