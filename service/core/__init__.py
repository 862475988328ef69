"""Process-wide setup: settings and logging."""
