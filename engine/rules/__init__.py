"""Pure rules: decisions as values, no I/O (no database, broker, network or clock of their own)."""
