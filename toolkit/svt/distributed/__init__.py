"""Evaluate and fit beyond one machine: a distributed engine behind a small interface
(:mod:`svt.distributed.engines`) and summaries that merge by addition (:mod:`svt.distributed.summaries`)."""
