"""svt's vLLM plugin: labelled draft traces from inside a vLLM engine, in svt's trace schema.

Registered under the ``vllm.general_plugins`` entry point, so vLLM loads it in every engine and
worker process. It is inert unless ``SVT_TRACE_DIR`` is set: :func:`register` then returns
without importing anything of vLLM's or patching anything. When it is set, the plugin checks the
vLLM version it was written against (:data:`SUPPORTED_VLLM`), refuses any other with one clear
message, and hooks the engine (all private internals are touched in :mod:`.internals` alone):

- after each proposal, the drafter's distribution q is reduced on the device to four statistics
  per draft token (q_max, top-1 minus top-2, entropy, q of the drafted token) and copied;
- at each verification, the target's processed distribution p is reduced to p of the drafted token,
  p_max, the token's exact acceptance probability min(1, p/q) and 1 - TV(p, q); the rejection
  sampler's own output gives the labels;
- finished requests (prompt, output, finish reason) are taken from the scheduler.

Rows are spooled to ``$SVT_TRACE_DIR/spool/<host>-<pid>/`` as atomic Parquet files (one process
never writes another's), and ``svt vllm-finish SPOOL --out RUN`` (or ``svt collect --engine vllm``,
which does it itself) turns the spool into a run directory every svt command reads.
"""

from __future__ import annotations

import os

from svt.vllm_plugin.settings import TRACE_DIR_ENV


def register() -> None:
    """The ``vllm.general_plugins`` entry point: inert unless ``SVT_TRACE_DIR`` is set."""
    trace_dir = os.environ.get(TRACE_DIR_ENV)
    if not trace_dir:
        return
    from svt.vllm_plugin.recorder import activate

    activate(trace_dir)
