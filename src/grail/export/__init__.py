"""Stage export: model, benchmark and manifest to S3 or a folder; the registry entry (by
reference)."""
