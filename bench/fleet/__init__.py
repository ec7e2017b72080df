"""Benchmarks of the fleet as a whole: faults, hostile clients, start-up, containers, CPU, the cost model."""
