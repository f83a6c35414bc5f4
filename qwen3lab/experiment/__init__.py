"""What to measure: typed specs, experiment files (base + chapters + matrix + overrides), pre-flight."""
