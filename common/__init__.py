"""dynspec.common: what every dynspec command shares (flags, environment layering, exit codes)."""
