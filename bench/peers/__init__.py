"""The reference implementations the learning benchmarks race: Stable-Baselines3 with the zoo's settings."""
