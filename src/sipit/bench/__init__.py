"""Benchmarks that print JSON."""
