"""Benchmarks of learning: time and env steps to solve, against the peers; learner throughput."""
