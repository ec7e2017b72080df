"""What the tests and the benchmarks share: fleets started as processes or containers, network
namespaces, fuzzers, fakes and toy envs. Never imported by common/, services/ or cli/."""
