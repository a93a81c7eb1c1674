"""The ``svt`` command line: one thin function per command over the library; no science here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from svt.errors import ConfigError, SvtError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

app = typer.Typer(
    help="svt: collect, fit, evaluate and plot acceptance predictors for speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
# off a terminal (logs, CI) nothing wraps or is cut: tables keep their natural width
WIDE = 100_000
err = Console(stderr=True, width=None if sys.stderr.isatty() else WIDE)
out = Console(width=None if sys.stdout.isatty() else WIDE)


# --feature-module, the same for every command that reads features (evaluate, fit, collect's live AV)
FeatureModule = Annotated[str | None, typer.Option(
    help="Python module whose @svt.features.feature functions add features (e.g. my_pkg.feats).")]


def _load_features(module: str | None) -> None:
    if module is not None:
        from svt.features import load_feature_module

        load_feature_module(module)


def _say(message: str) -> None:
    """A plain line: paths and names are never read as rich markup."""
    out.print(message, markup=False, highlight=False)


def _fail(exc: SvtError) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return typer.Exit(exc.exit_code)


@app.command()
def collect(
    config: Annotated[Path, typer.Argument(help="Collect config (YAML), e.g. configs/collect/demo.yaml.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Run directory to write.")],
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run in --out.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing run in --out.")] = False,
    limit_requests: Annotated[int | None, typer.Option(help="Override `requests`.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Override `max_new_tokens`.")] = None,
    seed: Annotated[int | None, typer.Option(help="Override `seed`.")] = None,
    device: Annotated[str | None, typer.Option(help="Override `device` (auto, cpu, cuda).")] = None,
    workload: Annotated[list[str] | None, typer.Option(
        help="Override `workloads` (repeat for several): a name in data/workloads or a JSONL path.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Set any config key, e.g. --set temperature=0 --set log.hidden=true.")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    profile_costs: Annotated[bool, typer.Option(
        "--profile-costs", help="Instead of collecting, measure the pair's draft and verify times "
                                "over batch sizes 1..64 and write a cost table (YAML) to --out.")] = False,
    profile_batches: Annotated[str | None, typer.Option(
        help="With --profile-costs: the batch sizes to profile, e.g. 1,8,64 (default 1,2,4,...,64).")] = None,
    shard: Annotated[str | None, typer.Option(
        help="Collect only shard i of n (0-based, e.g. --shard $SLURM_ARRAY_TASK_ID/8) into --out; "
             "`svt merge` puts the shards together into the run an unsharded collection writes.")] = None,
    engine: Annotated[str | None, typer.Option(
        help="svt (svt's own batched collector), vllm (an offline vLLM run with svt's plugin "
             "recording; the config's `vllm:` section sets vLLM's speculative method) or reference (no "
             "target forward: each prompt's reference is the output; cache drafts with oracle yields, "
             "model-drafter yields from `draft:` teacher-forced or a `stand_in:`). Default: the "
             "config's `engine` (svt).")] = None,
    feature_module: FeatureModule = None,
    threads: Annotated[int | None, typer.Option(
        help="torch's CPU threads (default: the cores available to this process). Processes that "
             "share a machine, e.g. --shard processes started together, should each pass their share: "
             "more threads than free cores makes every step wait for the slowest.")] = None,
) -> None:
    """Run speculative decoding on a local target/draft pair and log every draft with its label.

    Example: [bold]svt collect configs/collect/demo.yaml --out runs/demo --set temperature=0[/]
    Costs:   [bold]svt collect configs/collect/demo.yaml --profile-costs --out costs/tiny-cpu.yaml[/]
    Real text: [bold]svt collect configs/collect/reference.yaml --out runs/ref[/] (engine: reference)
    """
    from svt.collect.engines import collect as run_collect
    from svt.collect.shards import parse_shard

    try:
        from svt.config import ENGINES
        from svt.devices import set_threads

        set_threads(threads)  # recorded in run.json (environment) and in a cost table's measurement
        if engine is not None and engine not in ENGINES:
            raise ConfigError(f"Unknown --engine {engine!r}: expected {', '.join(ENGINES)}.")
        _load_features(feature_module)  # a live-AV fit may score a feature of the user's
        cfg = _collect_config(config, set_, requests=limit_requests, max_new_tokens=max_new_tokens, seed=seed,
                              device=device, workloads=workload, engine=engine)
        if profile_costs:
            if shard is not None or resume or cfg.engine != "svt":
                raise ConfigError("--profile-costs measures svt's engine on the pair; it takes no --shard, "
                                  "--resume or other --engine.")
            return _profile_costs(cfg, config, out_dir, profile_batches, overwrite=overwrite, quiet=quiet)
        if profile_batches is not None:
            raise ConfigError("--profile-batches goes with --profile-costs.")
        summary = run_collect(cfg, out_dir, config_path=config, resume=resume, overwrite=overwrite,
                              progress=not quiet, shard=parse_shard(shard))
    except SvtError as exc:
        raise _fail(exc) from None
    _collect_summary(cfg, summary)


def _collect_summary(cfg, summary) -> None:
    """What `svt collect` prints of the run it wrote."""
    if cfg.engine == "reference":
        from svt.traces.io import read_meta

        drafter = read_meta(summary.run_dir).get("drafter") or {}
        how = {"model": f"no target forward; the draft {drafter.get('path')} teacher-forced on the reference labels "
                        "its cache drafts",
               "head": f"the {drafter.get('head')} drafter {drafter.get('path')} over the target's hidden states of the "
                       "reference labels its cache drafts",
               "stand-in": "no target forward; a stand-in drafter's draws label its cache drafts"}.get(
            drafter.get("kind"), "no target forward; cache drafts only")
        _say(f"wrote {summary.run_dir}: {summary.requests} requests, {summary.output_tokens:,} reference "
             f"tokens (a reference run: no acceptance labels; {how}) in {summary.seconds:.1f} s")
        _reading_notes(summary.run_dir)
        return
    if cfg.tree is not None:
        from svt.traces.io import read_meta

        tree = read_meta(summary.run_dir)["tree"]
        _say(f"wrote {summary.run_dir}: {summary.requests} requests, {tree['tree_nodes']:,} tree nodes over "
             f"{tree['steps']:,} steps ({tree['accepted_per_step']:.2f} accepted per step, "
             f"{tree['accepted_per_node']:.3f} per node), {summary.output_tokens:,} tokens in {summary.seconds:.1f} s")
        return
    drafted = (f"{summary.drafts:,} drafts ({summary.labelled:,} labelled, acceptance {summary.acceptance:.3f})"
               if summary.drafts else "plain decoding (k = 0, nothing drafted)")
    out.print(
        f"wrote {summary.run_dir}: {summary.requests} requests, {drafted}, "
        f"{summary.output_tokens:,} tokens in {summary.seconds:.1f} s"
        + (f" (resumed after {summary.resumed_batches} complete batches)" if summary.resumed_batches else "")
    )
    _reading_notes(summary.run_dir)


def _reading_notes(run_dir) -> None:
    """What the run's workload reading left out or repeated (run.json's ``workload_reading``)."""
    from svt.traces.io import read_meta

    try:
        meta = read_meta(run_dir)
    except SvtError:
        return
    reading = meta.get("workload_reading") or {}
    skipped = {n: c for n, c in (reading.get("skipped_no_reference") or {}).items() if c}
    if skipped:
        _say("skipped prompts without a usable reference: " + ", ".join(f"{n} {c:,}" for n, c in skipped.items()))
    long = {n: c for n, c in (reading.get("skipped_long_head") or {}).items() if c}
    if long:
        _say("skipped prompts whose head is longer than max_prompt_tokens (on_long_head: skip): "
             + ", ".join(f"{n} {c:,}" for n, c in long.items()))
    opening = {n: c for n, c in (reading.get("assistant_turns_without_prompt") or {}).items() if c}
    if opening:
        _say("assistant turns that open a conversation (nothing before them to prompt with; not requests): "
             + ", ".join(f"{n} {c:,}" for n, c in opening.items()))
    if reading.get("repeated_requests"):
        _say(f"{reading['repeated_requests']:,} requests repeat a row (repeat: true)"
             + (": their answers are already in the suffix cache's global tree" if meta.get("cache") else ""))


def _collect_config(config: Path, set_: list[str] | None, **flags):
    """The collect config with ``--set`` keys and the named flags (None: not given) applied."""
    from svt.config import load_collect_config, parse_set

    overrides = parse_set(set_ or [])
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return load_collect_config(config, overrides)


def _profile_costs(cfg, config: Path, out_dir: Path, batches: str | None, *, overwrite: bool, quiet: bool) -> None:
    from svt.collect.profile import parse_batches, profile_pair
    from svt.config import resolve_path
    from svt.models import load_pair
    from svt.simulate.cost_files import check_costs_out, write_costs

    check_costs_out(out_dir, overwrite=overwrite)  # before the minutes of profiling
    pair = load_pair(resolve_path(cfg.target, config), resolve_path(cfg.draft, config),
                     device=cfg.device, dtype=cfg.dtype)
    from svt.collect.profile import collection_context, collection_prompts

    prompts = collection_prompts(cfg, config, pair.tokenizer)
    table = profile_pair(pair.target, pair.draft, k=cfg.k, batches=parse_batches(batches),
                         progress=None if quiet else lambda what: _say(f"profiled {what}"),
                         verify_tokens=None if cfg.tree is None else cfg.tree.size() + 1,
                         context=collection_context(prompts, cfg.max_new_tokens),
                         prompts=(prompts or None) if cfg.tree is None else None,  # trees: one request at a time
                         max_new_tokens=cfg.max_new_tokens, static=cfg.schedule == "static",
                         temperature=cfg.temperature, top_p=cfg.top_p)
    ident = pair.identity()
    write_costs(table, out_dir, {"models": {**{k: v["path"] for k, v in ident.items() if isinstance(v, dict) and "path" in v},
                                            "weights": {k: v["weights_sha256_16"] for k, v in ident.items()
                                                        if isinstance(v, dict) and "weights_sha256_16" in v}}})
    for w in table.measurement.get("warnings", []):
        err.print(f"[yellow]warning:[/] the cost table may not be the machine's: {w}. Its replays will say "
                  "so; profile again on a quiet machine.")
    _say(f"wrote {out_dir}")


@app.command("vllm-finish")
def vllm_finish(
    trace_dir: Annotated[Path, typer.Argument(help="The SVT_TRACE_DIR a vLLM engine traced into.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="The run directory to write.")],
    overwrite: Annotated[bool, typer.Option(help="Replace an existing run in --out.")] = False,
    draft: Annotated[Path | None, typer.Option(
        help="A suffix-method run's model drafter (local folder): its teacher-forced accepted length "
             "labels each cache draft (`model_accepted`).")] = None,
) -> None:
    """Turn what svt's vLLM plugin spooled (vLLM run with SVT_TRACE_DIR set, e.g. `vllm serve`) into
    a run directory. Requests are numbered in the order they finished; unfinished and aborted ones
    are left out (run.json counts them).

    Example: [bold]SVT_TRACE_DIR=traces/serve vllm serve ... ; svt vllm-finish traces/serve --out runs/serve[/]
    """
    from svt.vllm_plugin.finish import finish_spool, finish_warnings

    try:
        meta = finish_spool(trace_dir, out_dir, overwrite=overwrite, draft=draft)
    except SvtError as exc:
        raise _fail(exc) from None
    c = meta["counts"]
    _say(f"wrote {out_dir}: {c['requests']} requests, {c['drafts']:,} drafts ({c['labelled']:,} labelled)"
         + (f", {meta['cache']['rows']:,} cache drafts" if meta.get("cache") else ""))
    for warning in finish_warnings(meta):
        _say(f"warning: {warning}")


@app.command()
def merge(
    parts: Annotated[list[Path], typer.Argument(help="The shard run directories (from `svt collect --shard i/n`).")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="The merged run directory to write.")],
    overwrite: Annotated[bool, typer.Option(help="Replace an existing run in --out.")] = False,
    link: Annotated[bool, typer.Option(help="Hard-link the shard files instead of copying them "
                                            "(same filesystem; the parts must then stay read-only).")] = False,
) -> None:
    """Merge the shards of one collection into one run: checks that they share the config, model
    weights and prompt files, that every shard is there once and complete, then writes the run an
    unsharded collection would have written (the same rows and files).

    Example: [bold]svt merge runs/big.shard-* --out runs/big[/]
    """
    from svt.collect.shards import merge_shards

    try:
        meta = merge_shards(parts, out_dir, overwrite=overwrite, link=link)
    except SvtError as exc:
        raise _fail(exc) from None
    c = meta["counts"]
    _say(f"wrote {out_dir}: {len(parts)} shards, {c.get('requests', 0):,} requests, {c.get('drafts', 0):,} drafts "
         f"({c.get('labelled', 0):,} labelled)")


@app.command("import")
def import_(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help="vllm-steps, specdec-tokens, arctic-sim or table.")],
    path: Annotated[Path, typer.Argument(help="The foreign trace file.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="The run directory to write.")],
    mapping: Annotated[Path | None, typer.Option(help="table: a column-mapping YAML (rows, columns, workload).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing run in --out.")] = False,
) -> None:
    """Import a trace another tool wrote as a run directory; run.json says what its format lacks
    (e.g. draft probabilities), and `svt evaluate` says which studies that rules out.

    Example: [bold]svt import vllm-steps metrics.jsonl --out runs/served[/]
    """
    from svt.interop import import_trace

    try:
        summary = import_trace(fmt, path, out_dir, mapping=mapping, overwrite=overwrite)
    except SvtError as exc:
        raise _fail(exc) from None
    from svt.traces.io import read_meta

    tree = read_meta(out_dir).get("tree")
    if tree:
        _say(f"wrote {out_dir}: {summary.requests:,} requests, {summary.steps:,} tree steps, {tree['tree_nodes']:,} "
             f"nodes ({tree['accepted_per_step']:.3f} accepted per step; counts per step, no per-node rows)")
        return
    _say(f"wrote {out_dir}: {summary.requests:,} requests, {summary.steps:,} steps, {summary.drafts:,} drafts "
         f"({summary.labelled:,} labelled, acceptance {summary.acceptance:.3f})")


@app.command()
def export(
    kind: Annotated[str, typer.Argument(help="profile (of a run, .json), features (of a report, .csv or "
                                             ".parquet), latex (of a report, .tex), or a run in an import "
                                             "format: vllm-steps or specdec-tokens (.jsonl).")],
    source: Annotated[Path, typer.Argument(help="A run directory (profile) or a report directory / report.json.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The file to write.")],
    overwrite: Annotated[bool, typer.Option(help="Replace an existing file in --out.")] = False,
) -> None:
    """Write what other tools read: a run's speculation profile (acceptance by position, acceptance
    length), a report's feature table as CSV/Parquet, its tables as LaTeX (booktabs), or a run in
    a format `svt import` reads.

    Example: [bold]svt export profile runs/demo --out profile.json[/]
    """
    from svt.interop.export import export as export_

    try:
        written = export_(kind, source, out_path, overwrite=overwrite)
    except SvtError as exc:
        raise _fail(exc) from None
    _say(f"wrote {written}")


@app.command()
def inspect(
    runs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    deep: Annotated[bool, typer.Option(help="Also check values (NaN, ranges, labels), not only schemas.")] = True,
) -> None:
    """Validate run directories and print their summary and acceptance by draft position.

    Example: [bold]svt inspect runs/demo[/]
    """
    from svt.report.summary import acceptance_by_position, run_summary, run_tree
    from svt.report.text import add_row, new_table

    try:
        for path in runs:
            summary = run_summary(path, deep=deep)
            imported = summary.pop("imported", None)
            out.print(f"[bold]{escape(str(path))}[/]  " + escape("  ".join(f"{k}={v}" for k, v in summary.items())))
            if imported:
                _say(imported)
            tree = run_tree(path)
            if tree is not None:
                _say(tree["line"])
                if tree["by_depth"] is not None:
                    table = new_table("depth", "nodes", "verified", "accepted", "accepted given tried",
                                      title="tree nodes by depth")
                    for row in tree["by_depth"]:
                        add_row(table, str(row["depth"]), f"{row['nodes']:,}", f"{row['verified']:,}",
                                f"{row['accepted']:,}", f"{row['conditional']:.3f}")
                    out.print(table)
                continue
            if not summary.get("drafts"):
                _say("no model drafts (a reference or cache-only run): no acceptance by position; its cache "
                     "drafts are read by `svt fit --model yield-mlp` and `svt evaluate`")
                continue
            table = new_table("position", "proposed", "verified", "accepted",
                              "conditional rate", "marginal rate", title="acceptance by draft position")
            for row in acceptance_by_position(path).iter_rows(named=True):
                add_row(table, str(row["position"]), f"{row['proposed']:,}", f"{row['verified']:,}",
                              f"{row['accepted']:,}", f"{row['conditional']:.3f}", f"{row['marginal']:.3f}")
            out.print(table)
    except SvtError as exc:
        raise _fail(exc) from None


@app.command()
def evaluate(
    runs: Annotated[list[Path], typer.Argument(help="One or more run directories (compared side by side).")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Report directory (report.json, report.md).")],
    feature: Annotated[list[str] | None, typer.Option(
        help="Feature to score (repeat for several); default: the built-in table.")] = None,
    feature_module: FeatureModule = None,
    by: Annotated[str | None, typer.Option(help="Also report per value of a drafts column, e.g. workload.")] = None,
    bins: Annotated[int, typer.Option(help="ECE bins.")] = 10,
    bootstrap: Annotated[int, typer.Option(help="Request-level bootstrap resamples for 95% intervals.")] = 0,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    replay_bootstrap: Annotated[int, typer.Option(
        help="AV replay: request-level resamples for throughput intervals (each a whole replay; 0 = none, "
             "20 in svt's CI).")] = 0,
    fit: Annotated[list[Path] | None, typer.Option(
        "--fit", help="A fit file from `svt fit` to score beside the features (repeat for several).")] = None,
    costs: Annotated[Path | None, typer.Option(
        help="A cost table (configs/costs/*.yaml or from --profile-costs): adds the Adaptive "
             "Verification replay (fixed K, AV per predictor, oracle) across concurrency.")] = None,
    live: Annotated[list[Path] | None, typer.Option(
        "--live", help="A live run of svt's engine (fixed K, k = 0, or live AV with its fit passed by --fit): "
             "its measured decode tokens/s beside the replay's under --costs for the same policy and batch "
             "size, and what the gap is made of (repeat for several runs; rounds of one point get a median "
             "and range).")] = None,
    high_yield: Annotated[int, typer.Option(
        help="Yield predictors: a cache draft is high-yield when its accepted length is >= this.")] = 6,
    score_unverified: Annotated[bool, typer.Option(
        help="Score a fit on requests svt cannot show it did not train on (a run without tokens, short "
             "requests); refused by default, and said in the fit's description when given.")] = False,
    reference_run: Annotated[Path | None, typer.Option(
        help="A reference run of the same prompts (`--engine reference`): its cache statistics go beside "
             "this run's in the realism table.")] = None,
    baseline: Annotated[Path | None, typer.Option(
        help="A saved report.json (or its directory) to compare with: writes regression.md and "
             "regression.json; exit 1 when a metric regressed, 6 when the reports cannot be compared.")] = None,
    tolerance: Annotated[list[str] | None, typer.Option(
        help="With --baseline: METRIC=VALUE or SCOPE.METRIC=VALUE (e.g. auc=0.005, per_position.auc=0.02); "
             "overrides the baseline's bootstrap interval for that metric.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the report already in --out.")] = False,
    cluster: Annotated[str | None, typer.Option(
        help="Compute the features table (per run, per --by value, and row-wise --fit predictors) on a cluster: "
             "local:N starts N workers here, an address (tcp://host:8786) joins a running scheduler. Exact AUCs and "
             "counts; the other sections are refused by name (docs: Scale).")] = None,
    cluster_engine: Annotated[str, typer.Option(help="The distributed engine for --cluster.")] = "dask",
) -> None:
    """Score acceptance features: AUC, log-loss, ECE, Brier, per position and excluding the first,
    soft labels, expected-length calibration and the losslessness bias of trimming. On greedy runs
    with cache drafts: cache opportunity, yield predictors (--fit of a yield fit) and, with --costs,
    the Hybrid Verified Decoding replay across τ.

    Example: [bold]svt evaluate runs/demo --out reports/demo --by workload --fit fits/online.json[/]
    HVD:     [bold]svt evaluate runs/greedy --out reports/hvd --fit fits/yield-mlp.json --costs costs.yaml[/]
    Real text: [bold]svt evaluate runs/ref --out reports/ref --costs costs.yaml[/] (a reference run: the
    HVD map across drafter strengths, the two-sided switch, the document's checks)
    Cluster: [bold]svt evaluate runs/big --out reports/big --cluster local:2[/] (the features table, exact AUCs)
    \f
    Long because typer declares each option as a parameter; the body is the checks, one call and the writing.
    """
    from svt.features import run_features
    from svt.report import EvaluateOptions, write_report
    from svt.report import evaluate as build
    from svt.report.console import evaluate_tables
    from svt.traces.io import carried_columns

    # the default features, and a confidence head's own where every run's drafter logged one
    feature = feature or list(run_features(carried_columns(runs)))

    if cluster is not None:
        _evaluate_on_cluster(runs, out_dir, list(feature), cluster, cluster_engine, overwrite=overwrite,
                             bins=bins, by=by, bootstrap=bootstrap, fits=fit, costs=costs, live=live,
                             reference_run=reference_run, baseline=baseline, feature_module=feature_module,
                             replay_bootstrap=replay_bootstrap, score_unverified=score_unverified,
                             seed=seed != 0, tolerance=tolerance, high_yield=high_yield != 6)
        return
    try:
        tolerances, base = _evaluate_checks(out_dir, bins=bins, bootstrap=bootstrap, high_yield=high_yield,
                                            live=live, costs=costs, tolerance=tolerance, baseline=baseline,
                                            replay_bootstrap=replay_bootstrap, overwrite=overwrite)
    except SvtError as exc:
        raise _fail(exc) from None
    paths = {"costs": costs, "reference_run": reference_run}
    opts = EvaluateOptions(features=list(feature), feature_module=feature_module,
                           n_bins=bins, bootstrap=bootstrap, seed=seed, by=by, replay_bootstrap=replay_bootstrap,
                           fits=[str(f) for f in fit or []], high_yield=high_yield, score_unverified=score_unverified,
                           live=[str(p) for p in live or []], **{k: str(v) if v else None for k, v in paths.items()})
    from svt.fileio import writing
    from svt.report.compare import remove_stale
    from svt.report.render import check_report_out

    try:  # one writer per report folder, its checks repeated while it is held
        with writing(out_dir, lambda: check_report_out(out_dir, overwrite=overwrite)):
            report = build(runs, opts)
            json_path, md_path = write_report(report, out_dir)
            remove_stale(out_dir)  # a regression report beside the old report.json no longer applies
    except SvtError as exc:
        raise _fail(exc) from None
    for item in evaluate_tables(report):
        out.print(item)
    _say(f"wrote {json_path} and {md_path}")
    if base is not None:
        report["_path"] = str(json_path)
        _regression(base, report, tolerances, out_dir)


def _evaluate_on_cluster(runs: list[Path], out_dir: Path, features: list[str], cluster: str, engine: str, *,
                         overwrite: bool, bins: int, **asked) -> None:
    from svt.distributed.report import check_cluster_options, cluster_report, write_cluster_report
    from svt.fileio import writing
    from svt.report.compare import remove_stale
    from svt.report.render import check_report_out

    try:
        check_cluster_options(runs, bins, **asked)
        with writing(out_dir, lambda: check_report_out(out_dir, overwrite=overwrite)):
            report = cluster_report(runs, features, cluster, engine, by=asked.get("by"), fits=asked.get("fits"),
                                    score_unverified=bool(asked.get("score_unverified")), bins=bins)
            json_path, md_path = write_cluster_report(report, out_dir)
            remove_stale(out_dir)  # nor does a regression report written beside the old one
    except SvtError as exc:
        raise _fail(exc) from None
    _say(f"wrote {json_path} and {md_path}")


def _evaluate_checks(out_dir: Path, *, bins, bootstrap, high_yield, live, costs, tolerance, baseline,
                     replay_bootstrap, overwrite) -> tuple[dict, dict | None]:
    """The option checks of `svt evaluate`, before any run is read; the tolerances and the baseline."""
    from svt.report.compare import load_report
    from svt.report.judge import parse_tolerances
    from svt.report.render import check_report_out

    if bins < 1 or bootstrap < 0 or high_yield < 1:
        raise ConfigError(f"Expected --bins >= 1, --bootstrap >= 0 and --high-yield >= 1, but got "
                          f"{bins}, {bootstrap} and {high_yield}.")
    if live and not costs:
        raise ConfigError("--live needs --costs (the replay it is compared with).")
    if tolerance and baseline is None:
        raise ConfigError("--tolerance needs --baseline (the report to compare with).")
    if replay_bootstrap and not (2 <= replay_bootstrap <= 1000 and costs):
        raise ConfigError("--replay-bootstrap takes 2 to 1000 resamples, with --costs (the AV replay).")
    tolerances = parse_tolerances(tolerance)
    base = load_report(baseline, "Baseline report") if baseline else None
    if base is not None and Path(base["_path"]).resolve() == (out_dir / "report.json").resolve():
        raise ConfigError(f"--baseline {baseline} is the report this command writes (--out {out_dir}); "
                          "write the new report elsewhere, or keep a copy of the baseline.")
    check_report_out(out_dir, overwrite=overwrite)  # fails fast; checked again while the output is held
    return tolerances, base


def _regression(base: dict, now: dict, tolerances: dict, out_dir: Path) -> None:
    from svt.report.compare import EXIT_REGRESSED, compare_reports, remove_stale, write_regression
    from svt.report.console import regression_table

    try:
        if out_dir.is_dir():
            remove_stale(out_dir)  # an earlier comparison's report must not outlive a failed one
        result = compare_reports(base, now, tolerances)
        json_path, md_path = write_regression(result, out_dir)
    except SvtError as exc:
        raise _fail(exc) from None
    out.print(regression_table(result))
    _say(("paired (tolerances decide): " if result["same_draws"] else "not paired (intervals decide): ")
         + result["pairing"]["reason"])
    for note in result["not_compared"]:
        _say(f"not compared: {note}")
    _say(f"wrote {md_path} and {json_path}")
    if result["verdict"] == "regressed":
        err.print(f"[bold red]regressed:[/] {result['regressed']} of {result['compared']} metrics are worse than "
                  f"their threshold (see {escape(str(md_path))}).", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_REGRESSED)


@app.command()
def compare(
    baseline: Annotated[Path, typer.Argument(help="The saved report.json (or its directory).")],
    report: Annotated[Path, typer.Argument(help="The new report.json (or its directory).")],
    out_dir: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Where regression.md and regression.json go (default: the new report's directory).")] = None,
    tolerance: Annotated[list[str] | None, typer.Option(
        help="METRIC=VALUE or SCOPE.METRIC=VALUE (e.g. auc=0.005, per_position.auc=0.02).")] = None,
) -> None:
    """Compare two evaluation reports metric by metric (direction-aware, bootstrap-aware). Exit 0: no
    regression; 1: a metric regressed; 6: the reports cannot be compared; 2: bad input.

    Example: [bold]svt compare ci/baseline/report.json reports/ci/report.json[/]
    """
    from svt.report.compare import load_report
    from svt.report.judge import parse_tolerances

    try:
        tolerances = parse_tolerances(tolerance)
        base = load_report(baseline, "Baseline report")
        now = load_report(report, "Report")
    except SvtError as exc:
        raise _fail(exc) from None
    _regression(base, now, tolerances, out_dir or Path(now["_path"]).parent)


@app.command()
def fit(
    runs: Annotated[list[Path], typer.Argument(help="One or more run directories to fit on.")],
    model: Annotated[str, typer.Option(help="irls-online, logistic, sts, platt, isotonic, head; yield "
                                            "predictors on cache drafts: yield-mlp, yield-linear, yield-gbm; node predictor on "
                                            "tree runs: tree-logistic. Several separated by commas fit in one "
                                            "process, each to <out>/<model>.json.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Fit file (JSON); a directory with --by or "
                                                             "several models.")],
    feature: Annotated[str | None, typer.Option(help="The feature (default: logit_qmax for irls-online "
                                                      "and logistic, q_max for the calibrators).")] = None,
    features: Annotated[list[str] | None, typer.Option(
        "--features", help="logistic: several features at once (repeat); yield fitters: the cache "
                           "features to use (default: all).")] = None,
    per_position_slope: Annotated[bool, typer.Option(help="One slope per position instead of a shared one.")] = False,
    preset: Annotated[str | None, typer.Option(help="irls-online preset: source or vllm.")] = None,
    cycle_steps: Annotated[int | None, typer.Option(help="irls-online: decode steps per cycle (N).")] = None,
    damping: Annotated[float | None, typer.Option(help="irls-online: c in n / (n + c).")] = None,
    ridge: Annotated[float | None, typer.Option(help="irls-online: ridge added to H.")] = None,
    label_delay: Annotated[int | None, typer.Option(help="irls-online: decode steps before a label reaches "
                                                         "the estimator (default 1, as in an engine).")] = None,
    test_fraction: Annotated[float | None, typer.Option(
        help="Offline fitters: share of requests held out (default 0.3).")] = None,
    mlp_hidden: Annotated[int | None, typer.Option(help="head: width of a hidden MLP layer (0 = linear head, "
                                                        "the default); yield-mlp: hidden width (0 = 64).")] = None,
    device: Annotated[str | None, typer.Option(help="head: training device (auto, cpu, cuda; default auto).")] = None,
    seed: Annotated[int | None, typer.Option(help="Offline fitters: seed of the request split (default 0).")] = None,
    by: Annotated[str | None, typer.Option(help="Fit one predictor per value of a drafts column "
                                                "(e.g. workload) and print slope and first intercept "
                                                "against the mean draft entropy.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing fit file in --out (never any other file).")] = False,
    feature_module: FeatureModule = None,
    cluster: Annotated[str | None, typer.Option(
        help="Fit the logistic model (distributed Newton) or yield-linear (summed normal equations) on a cluster "
             "(local:N, or a scheduler address) over the run's shards; the same fit file.")] = None,
    cluster_engine: Annotated[str, typer.Option(help="The distributed engine for --cluster.")] = "dask",
) -> None:
    """Fit an acceptance predictor on labelled drafts and save it as a file.

    Example: [bold]svt fit runs/demo --model irls-online --out fits/online.json[/]
    Several: [bold]svt fit runs/demo --model irls-online,logistic,isotonic --out fits/[/]
    Yield:   [bold]svt fit runs/greedy --model yield-mlp --out fits/yield-mlp.json[/]
    Cluster: [bold]svt fit runs/big --model logistic --out fits/big.json --cluster local:2[/]
    \f
    Long because typer declares each option as a parameter; the body checks every model's options
    before the first fit runs.
    """
    from svt.fit import fit_outs, fit_runs, prepare_fit
    from svt.fit.studies import fit_by_group

    try:
        _load_features(feature_module)
        models = [m.strip() for m in model.split(",")]
        # where each fit goes, checked before any fitting (which can take minutes)
        outs = fit_outs(models, out_path, overwrite) if by is None else None
        if by is not None and len(models) > 1:
            raise ConfigError("--by fits one model per group; give one --model with it.")
        onlines = {m: _online_options(m, preset=preset, feature=feature, cycle_steps=cycle_steps, damping=damping,
                                      ridge=ridge, label_delay=label_delay, per_position_slope=per_position_slope)
                   for m in models}
        # None: not given; a fitter refuses an option it does not take
        kwargs = dict(feature=feature, features=features, per_position_slope=per_position_slope or None,
                      test_fraction=test_fraction, seed=seed, mlp_hidden=mlp_hidden, device=device)
        for m in models:  # every model's options, before the first fit runs
            prepare_fit(m, online=onlines[m], **kwargs)
        if cluster is not None and (by is not None or len(models) != 1 or models[0] not in ("logistic", "yield-linear")):
            raise ConfigError("--cluster fits one model on the whole run, logistic or yield-linear (by summed "
                              "statistics); other models, several at once and --by run on one machine (without "
                              "--cluster).")
        if by is None:
            for m, path in outs.items():  # each file is written as soon as its fit is done
                fitted = (fit_runs(runs, m, online=onlines[m], **kwargs) if cluster is None else
                          _fit_on_cluster(runs, m, cluster, cluster_engine, **kwargs))
                fitted.save(path, overwrite)
                _say(_fit_line(fitted, path))
            return
        summary = fit_by_group(runs, models[0], by, out_path, online=onlines[models[0]], **kwargs)
    except SvtError as exc:
        raise _fail(exc) from None
    from svt.report.text import add_row, new_table

    table = new_table(by, "labelled", "acceptance", "mean draft entropy", "slope", "first intercept",
                      title=f"{model} fitted per {by}")
    for row in summary["groups"]:
        add_row(table, str(row["group"]), f"{row['labelled']:,}", f"{row['acceptance']:.3f}",
                f"{row['mean_entropy']:.3f}", f"{row['slope']:.4f}", f"{row['first_intercept']:.4f}")
    out.print(table)
    for key in ("r_slope_entropy", "r_intercept_entropy"):
        if summary.get(key) is not None:
            _say(f"{key} = {summary[key]:.3f}")
    _say(f"wrote {out_path}/ (one fit per {by}, summary.json)")


def _fit_on_cluster(runs, model: str, cluster: str, engine: str, **kwargs):
    from svt.distributed.fit_run import fit_on_cluster

    return fit_on_cluster(runs, model, cluster, engine, **{k: v for k, v in kwargs.items() if v is not None})


def _online_options(model: str, *, preset, feature, cycle_steps, damping, ridge, label_delay, per_position_slope):
    """The online estimator's options from the irls-online flags (None for any other model, which
    must not be given them)."""
    import dataclasses

    from svt.fit import PRESETS

    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"Unknown preset {preset!r}; known presets: {', '.join(PRESETS)}.")
    online_only = {"--preset": preset, "--cycle-steps": cycle_steps, "--damping": damping, "--ridge": ridge,
                   "--label-delay": label_delay}
    given = [k for k, v in online_only.items() if v is not None]
    if model != "irls-online":
        if given:
            from svt.fit import get_fitter

            raise get_fitter(model).refuse(given)
        return None
    online = dataclasses.replace(PRESETS[preset or "source"])
    for key, value in (("feature", feature), ("cycle_steps", cycle_steps), ("damping", damping),
                       ("ridge", ridge), ("label_delay", label_delay)):
        if value is not None:
            setattr(online, key, value)
    if per_position_slope:
        online.per_position_slope = True
    return online


def _fit_line(fit, out_path: Path) -> str:
    """One line on what `svt fit` wrote."""
    what = fit.summary()
    training = fit.training_
    if fit.table == "drafts":
        on = ", ".join(getattr(fit, "features", None) or [fit.feature])
        data = f"{training['rows']:,} labelled drafts"
    elif fit.table == "tree_drafts":
        on = f"{len(fit.features)} node features"
        data = f"{training['rows']:,} tree nodes, node rate {training['node_rate']:.3f}"
    else:
        on = f"{len(fit.features)} cache features"
        data = f"{training['rows']:,} cache drafts, mean yield {training['mean_yield']:.3f}"
    return (f"wrote {out_path}: {fit.name} on {on}{''.join(', ' + w for w in what)} "
            f"({data}; evaluation: {training['evaluation']})")


@app.command()
def cache(
    run: Annotated[Path, typer.Argument(help="A greedy run directory (temperature 0) from `svt collect`.")],
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="SuffixDecoding option, e.g. --set max_draft_len=24 --set min_token_prob=0.05 "
                      "(keys: max_tree_depth, max_draft_len, max_spec_factor, max_spec_offset, "
                      "min_token_prob, max_cached_requests, history; tree=true also logs SuffixDecoding's "
                      "tree drafts in `cache_trees`).")] = None,
    device: Annotated[str, typer.Option(help="Device for the draft model's teacher-forced pass.")] = "auto",
    target: Annotated[Path | None, typer.Option(help="The target's directory, if it moved since collection "
                                                      "(its weights must hash as run.json records).")] = None,
    draft: Annotated[Path | None, typer.Option(help="The draft's directory, if it moved (hash-checked).")] = None,
) -> None:
    """Add (or redo) the `cache_drafts` table of an existing greedy run without decoding again:
    SuffixDecoding replayed over its requests in server order, each draft's oracle yield and the
    model drafter's accepted length at the same position. The draft model is the run's own,
    checked against the weights hash in run.json.

    Example: [bold]svt cache runs/greedy --set max_draft_len=24[/]
    """
    from svt.collect.add_cache import add_cache_to_run
    from svt.config import parse_set

    try:
        entry = add_cache_to_run(run, parse_set(set_ or []), device=device, target=target, draft=draft)
    except SvtError as exc:
        raise _fail(exc) from None
    _say(f"wrote {run / 'cache_drafts'}: {entry['rows']:,} positions (arctic-inference "
              f"{entry['arctic_inference']}, median lookup {entry['lookup_ms_median'] * 1e3:.1f} µs)")
    if "trees" in entry:
        _say(f"wrote {run / 'cache_trees'}: {entry['trees']['nodes']:,} tree nodes")


@app.command()
def plot(
    kind: Annotated[str, typer.Argument(help="reliability, roc, per-position, pareto, coefficients, "
                                             "features, hvd, yield-pr, or all.")],
    input_path: Annotated[Path, typer.Argument(help="A report directory / report.json (a fit file for "
                                                    "coefficients).")],
    out_path: Annotated[Path | None, typer.Option("--out", "-o", help="Figure file (.png or .svg); "
                                                        "not used with `all`.")] = None,
    fit: Annotated[list[Path] | None, typer.Option("--fit", help="all: online fits to draw the "
                                                          "coefficient paths of.")] = None,
    link: Annotated[list[Path] | None, typer.Option("--link", help="all: other report directories to link "
                                                            "(with their figures) from this report.md.")] = None,
    vmax: Annotated[float | None, typer.Option(
        help="hvd-map (and all): the symmetric colour scale's limit in %, e.g. 40, so that maps of several "
             "reports share one scale (default: the map's own largest gain).")] = None,
) -> None:
    """Draw a figure from a report or a fit (plots read stored results; nothing is recomputed).
    `all` writes every figure into REPORT/figures/ and links them from report.md.

    Example: [bold]svt plot reliability reports/demo --out reports/demo/reliability.png[/]
    """
    import warnings

    from svt import plots

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", plots.UnreadableFigure)
        _plot(kind, input_path, out_path, fit, link, vmax)
    for w in seen:
        if issubclass(w.category, plots.UnreadableFigure):
            err.print(f"[yellow]warning:[/] {w.message}")


def _plot(kind, input_path, out_path, fit, link, vmax) -> None:
    from svt import plots
    from svt.report.render import link_figures

    try:
        if kind == "all":
            written = plots.plot_all(input_path, fit or [], vmax=vmax)
            link_figures(input_path, written, related=link or [])
            for p in written:
                _say(f"wrote {p}")
            if not written:
                _say(f"{input_path}: the report has nothing to draw (e.g. an imported tree run with counts per "
                     "step only): no figures written")
            return
        fn = plots.get_plot(kind)
        if out_path is None:
            raise ConfigError("Pass --out FILE.png (or .svg).")
        if vmax is not None and kind != "hvd-map":
            raise ConfigError("--vmax sets the colour scale of hvd-map (or of `all`'s hvd-map).")
        written = plots.save(fn(plots.read_input(input_path), **({"vmax": vmax} if vmax is not None else {})),
                             out_path)
    except SvtError as exc:
        raise _fail(exc) from None
    _say(f"wrote {written}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
