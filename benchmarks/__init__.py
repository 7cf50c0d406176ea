"""Scripts that produce every figure in BENCHMARKS.md; each runs with one command."""
