"""Load tests and benchmarks; run as modules (python -m load_tests.<name>), outside pytest."""
