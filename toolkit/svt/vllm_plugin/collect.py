"""`svt collect --engine vllm`: the same collect config, run by an offline ``vllm.LLM`` with svt's
plugin recording, then finished into a run directory.

The prompts are the config's workloads, encoded exactly as svt's own collector encodes them and
passed to vLLM as token ids; every request gets its own sampling seed. The engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the plugin's recorder is flushed and checked here.
After the run, each request's output as vLLM returned it must equal what the plugin saw in the
scheduler; a difference is an error, not a run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from pathlib import Path

from svt.collect.engines import CollectOptions, Engine
from svt.errors import ConfigError, DataError
from svt.signals import sigterm_unwinds
from svt.traces.rundir import RunSummary


def _need_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ConfigError(
            "`--engine vllm` needs vLLM in this environment. On this machine: `make setup-vllm`, then "
            "`.venv-vllm/bin/svt collect --engine vllm CONFIG --out RUN`; on a GPU machine: "
            "`pip install 'svt[vllm]'` (or vLLM's own build of the supported version) beside svt."
        ) from None
    from svt.vllm_plugin.internals import check_version

    try:
        return check_version()
    except RuntimeError as exc:
        raise ConfigError(str(exc)) from None


def request_seed(seed: int, request: int) -> int:
    """The sampling seed of request ``request`` (independent streams, fixed by the config's seed)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, 1, request]).generate_state(1, dtype=np.uint32)[0] >> 1)


def collect_vllm(cfg, out: str | Path, *, config_path=None, overwrite: bool = False, progress: bool = True):
    """Run the config's workloads through vLLM with tracing on; write the run ``out``."""
    from svt.collect.encode import check_positions, encode_workloads, head_fits, position_limit
    from svt.collect.workloads import load_workloads
    from svt.config import resolve_path, to_dict

    out = _check_request(cfg, out, overwrite)
    target = resolve_path(cfg.target, config_path)
    draft = resolve_path(cfg.draft, config_path)
    for what, p in (("target", target), ("draft", draft)):
        if not (p / "config.json").is_file():
            raise ConfigError(f"`{what}`: {p} is not a local Hugging Face model folder (no config.json).")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    keep = head_fits(tok, cfg.max_prompt_tokens, cfg.max_new_tokens) if cfg.on_long_head == "skip" else None
    workloads = load_workloads(cfg.workloads, cfg.requests, config_path, turns=cfg.turns, repeat=cfg.repeat, keep=keep)
    encoded = encode_workloads(workloads, tok, cfg.max_prompt_tokens, cfg.max_new_tokens, cfg.on_long_head)
    prompts = workloads.prompts  # less the prompts whose head is too long (on_long_head: skip)
    ids = [e.prompt_ids for e in encoded]
    limits = [n for n in (position_limit(target), position_limit(draft)) if n is not None]
    check_positions(prompts, [len(x) + cfg.max_new_tokens + cfg.k + 1 for x in ids], min(limits, default=None),
                    "the target or the draft", "Lower `max_prompt_tokens` or `max_new_tokens`.")
    need = max(len(x) for x in ids) + cfg.max_new_tokens + cfg.k + 1
    if cfg.vllm.max_model_len < need:
        raise ConfigError(f"Expected `vllm.max_model_len` to be at least the longest prompt ({max(len(x) for x in ids)} "
                          f"tokens) + max_new_tokens + k + 1 = {need}, but got {cfg.vllm.max_model_len}: vLLM would cut "
                          "requests short and stop drafting near the end.")
    _need_vllm()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the recorder lives in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.vllm.kv_cache_gib))
    spool = out.parent / f".{out.name}.svt-spool-{uuid.uuid4().hex[:8]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    from svt.vllm_plugin.finish import finish_spool
    from svt.vllm_plugin.recorder import activate, deactivate

    t0 = time.time()
    # SIGTERM unwinds like Ctrl-C: the spool is removed, --out untouched
    with sigterm_unwinds(), contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, spool, ignore_errors=True)
        cleanup.callback(deactivate)
        activate(spool)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm = _engine(cfg, target, draft)
        params = [SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens,
                                 seed=request_seed(cfg.seed, i)) for i in range(len(ids))]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=progress)
        deactivate()
        seconds = time.time() - t0
        order = [o.request_id for o in outputs]
        meta = {"config": to_dict(cfg), "workloads": workloads.files, "workload_sha256": workloads.hashes,
                "workload_reading": workloads.reading,
                "seed": cfg.seed, "last_session_seconds": round(seconds, 2)}
        run_meta = finish_spool(spool, out, overwrite=overwrite, order=order,
                                workloads={o.request_id: prompts[i].workload for i, o in enumerate(outputs)},
                                meta=meta, draft=draft, strict=True,
                                verify=lambda staged: _check_outputs(staged, outputs, ids))
    c = run_meta["counts"]
    return RunSummary(out, c["requests"], c["drafts"], c["labelled"], c["accepted"], c["output_tokens"],
                          c["steps"], seconds, 0)


def _check_request(cfg, out, overwrite: bool) -> Path:
    """What the vLLM collector cannot do, and an --out it must not write to; the resolved --out."""
    for key, bad in (("av", cfg.av is not None), ("hvd", cfg.hvd is not None), ("cache", cfg.cache is not None),
                     ("log.hidden", cfg.log.hidden), ("log.dists_fraction", cfg.log.dists_fraction > 0)):
        if bad:
            raise ConfigError(f"`{key}` is not supported with --engine vllm (the vLLM collector writes the "
                              f"drafts, steps and requests tables); unset it, e.g. --set {key}=" +
                              ("false" if key == "log.hidden" else "0" if key == "log.dists_fraction" else "null")
                              + ".")
    if cfg.device not in ("auto", "cpu", "cuda") and not cfg.device.startswith("cuda"):
        raise ConfigError(f"Unknown device {cfg.device!r}.")
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; expected a run directory to write.")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty; pass --overwrite to replace it (the vLLM "
                          "collector does not resume).")
    if out.exists() and any(out.iterdir()) and not (out / "run.json").is_file():
        raise ConfigError(f"Refusing to overwrite {out}: it is not a run directory (no run.json).")
    return out


def _engine(cfg, target: Path, draft: Path):
    """vLLM's offline engine for the config (its own validation errors become one ConfigError)."""
    from vllm import LLM

    try:
        llm = LLM(model=str(target), tokenizer=str(target), dtype=cfg.dtype, seed=cfg.seed,
                  max_num_seqs=cfg.batch_size, max_model_len=cfg.vllm.max_model_len,
                  enforce_eager=cfg.vllm.enforce_eager,
                  speculative_config={"method": cfg.vllm.method, "model": str(draft),
                                      "num_speculative_tokens": cfg.k,
                                      "draft_sample_method": cfg.vllm.draft_sample_method},
                  **cfg.vllm.engine_args)
    except Exception as exc:  # vLLM's own validation (pydantic, ValueError, TypeError...)
        lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
        detail = next((x for x in lines if "rror" in x and "validation error" not in x), lines[0] if lines else "")
        if len(detail) > 600:
            detail = detail[:600].rsplit(" ", 1)[0] + " …"
        raise ConfigError(f"vLLM could not build the engine from this config ({type(exc).__name__}: "
                          f"{detail})") from None
    return llm


def _check_outputs(out: Path, outputs, prompt_ids) -> None:
    """Each request's prompt and output in the run equal what vLLM returned to the caller."""
    from svt.traces.io import open_run

    reqs = open_run(out, deep=False).scan("requests").sort("request").collect()
    if reqs.height != len(outputs):
        raise DataError(f"{out}: {reqs.height} requests recorded, but vLLM returned {len(outputs)}.")
    for i, (row, o) in enumerate(zip(reqs.iter_rows(named=True), outputs, strict=True)):
        if row["prompt_ids"] != list(prompt_ids[i]) or row["output_ids"] != list(o.outputs[0].token_ids):
            raise DataError(f"{out}: request {i}: the tokens the plugin recorded differ from vLLM's output; "
                            "the run is not trustworthy.")


class VllmEngine(Engine):
    """An offline vLLM run with svt's plugin recording (the config's ``vllm:`` section)."""

    name = "vllm"

    def collect(self, cfg, out: Path, options: CollectOptions) -> RunSummary:
        return collect_vllm(cfg, out, config_path=options.config_path, overwrite=options.overwrite,
                            progress=options.progress)
