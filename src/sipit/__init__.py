"""sipit: exact prompt recovery and injectivity tests for causal language models."""
