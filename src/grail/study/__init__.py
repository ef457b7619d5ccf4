"""The synthetic study: simulated participants whose true choice model is known, written as a
raw export (folders or the study's capsule layout) for the clean stage."""
