"""The kernels: one module per op family, the registry keyed by (domain, op, since_version)."""
