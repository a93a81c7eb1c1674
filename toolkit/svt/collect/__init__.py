"""Collectors: the sampling math, the batched engine and the runner that writes run directories."""
