"""The shipped recipes (YAML), installed as package data: grail.core.config finds them."""
