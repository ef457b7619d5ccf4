"""Stage train: GRPO and GRAIL (a GAIL-style discriminator reward) with TRL's GRPOTrainer."""
