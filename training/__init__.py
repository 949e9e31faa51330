"""Training utilities: data, evaluation, command line."""
