"""dynspec.launcher: starts and supervises the SGLang servers (or simulators) and the router."""
