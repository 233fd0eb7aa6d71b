"""dynspec.bench: concurrency sweeps, threshold suggestion and overhead benchmarks."""
