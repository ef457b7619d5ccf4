"""Stage clean: reading a raw export (grail's layout or the study's capsule), cleaning it into
the dataset contract, and the audit."""
