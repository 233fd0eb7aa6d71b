"""dynspec.router: the load-aware router between the EAGLE and baseline pools."""
