"""Thin KFP components, one per stage: typed parameters and artifacts in, one call into grail."""
