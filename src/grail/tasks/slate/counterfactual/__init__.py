"""Counterfactual evaluation of a simulator of people: it drives sessions under recommenders
it never saw, and the synthetic study's known choice model says what people would have done
(docs/counterfactual.md)."""
