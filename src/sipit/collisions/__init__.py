"""Collision tests: exact pairwise minimum distances between hidden states.

pairwise    the exact min-distance engine (certified fp32 GEMM screen + float64 recheck)
sampled     last-token states of sampled prompts at every layer (`sipit collisions`)
append_all  every vocabulary token appended to the closest prefixes (`sipit exhaustive`)
common      run directories that resume, state chunks, structural (duplicate-embedding) classes
"""
