"""Benchmarks (``python -m bench.<name>``): each measures against a baseline run in the same
process or run, prints ratios and records results in `bench/RESULTS.md`. May import every
package.
"""
