"""Stage data: the synthetic study, reading a raw export, cleaning into the dataset contract,
the audit."""
