"""Primitives every layer of the engine uses: errors, units, blocking rules, ranked locks,
rate-limited logs, the version."""
