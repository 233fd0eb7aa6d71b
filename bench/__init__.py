"""dynspec.bench: concurrency sweeps, threshold suggestion, the simulated experiments and the
real-GPU runs."""
