"""Collision tests: exact pairwise minimum distances between hidden states."""
