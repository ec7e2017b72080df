"""Benchmarks of the data path: codec, replay ingest and sampling, weight sync, gradient pushes, encryption."""
