import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# under pytest-xdist (`make test`: one worker per core) each worker is pinned to its own share of the
# cores, before torch (and the OpenMP runtime it loads) is imported: OpenMP sizes its thread team by
# the cores it may run on when it starts, and a team of two spinning on one core made scikit-learn's
# gradient boosting take minutes instead of a second. Two workers of two threads each on a 2-core
# machine also oversubscribe it: torch's spinning threads then slow every step.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, (os.cpu_count() or 2) // WORKERS)
if WORKERS > 1:
    try:
        _cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        _cores = []
    _worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0) % WORKERS
    _share = len(_cores) // WORKERS
    if _share:
        try:
            os.sched_setaffinity(0, _cores[_worker * _share:(_worker + 1) * _share])
        except OSError:  # a sandbox that refuses it: the workers share the cores, a thread each
            _share = 1
    THREADS = max(1, _share)
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "POLARS_MAX_THREADS"):
        os.environ[_var] = str(THREADS)  # the workers' own pools, sized to their cores (a user's setting too)

import torch  # noqa: E402  (after the pinning above)

torch.set_num_threads(THREADS)

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("SVT_TEST_MODELS", ROOT / "data" / "models"))


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS


@pytest.fixture(scope="session")
def tiny_pair():
    """The built-in target with the weaker draft, in float32 (exactness tests belong in fp32)."""
    from svt.models import load_pair

    return load_pair(MODELS / "target", MODELS / "draft-small", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, models_dir):
    """A real 9-request run of the tiny pair over the three shipped workloads, with dists."""
    from svt.collect import collect
    from svt.config import load_collect_config

    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose", "structured")],
            "requests": 9, "batch_size": 9, "max_new_tokens": 48, "k": 4, "device": "cpu",
            "max_prompt_tokens": 256, "log": {"dists_fraction": 0.3, "dists_top_k": 16, "hidden": True}}
    out = tmp_path_factory.mktemp("runs") / "small"
    collect(load_collect_config(None, base=base), out, progress=False)
    return out


@pytest.fixture(scope="session")
def greedy_run(tmp_path_factory, models_dir):
    """A real greedy 12-request run of the tiny pair with cache drafts (SuffixDecoding)."""
    from svt.collect import collect
    from svt.config import load_collect_config

    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "structured")],
            "requests": 12, "batch_size": 4, "max_new_tokens": 48, "k": 4, "device": "cpu",
            "temperature": 0, "max_prompt_tokens": 256, "cache": {"tree": True}}
    out = tmp_path_factory.mktemp("runs") / "greedy"
    collect(load_collect_config(None, base=base), out, progress=False)
    return out


def reseal(run_dir) -> None:
    """Record the current shards in run.json (and its row counts), as a foreign writer that wrote them
    would: lets a test reach the value checks behind the shard records."""
    import polars as pl

    from svt.traces.io import list_shards, read_meta, record_shards, write_meta
    from svt.traces.schema import TABLES

    meta = read_meta(run_dir)
    meta["shards"] = {}
    for t in TABLES:
        files = list_shards(run_dir, t)
        if files:
            record_shards(meta, t, files)
            if t in (meta.get("counts") or {}):  # and the counts, as a careful editor would
                meta["counts"][t] = sum(pl.scan_parquet(f).select(pl.len()).collect().item() for f in files)
    write_meta(run_dir, meta)


def outputs_agreeing(run_dir) -> None:
    """Each request's ``output_ids`` cut to the tokens its steps emit (a test that fabricates steps
    emitting less, e.g. drafts never verified, keeps the run whole: the reader checks that a
    request's steps add up to its output). Call before :func:`reseal`."""
    import polars as pl

    steps = pl.read_parquet(sorted((run_dir / "steps").glob("part-*.parquet")))
    emitted = steps.group_by("request").agg(pl.col("emitted").cast(pl.Int64).sum().alias("_e"))
    for part in sorted((run_dir / "requests").glob("part-*.parquet")):
        r = pl.read_parquet(part)
        # an output cut short ends as if by a stop token (`length` is an output of max_new_tokens)
        r.join(emitted, on="request", how="left", maintain_order="left").with_columns(
            pl.col("output_ids").list.head(pl.col("_e").fill_null(0)),
            pl.when(pl.col("_e").fill_null(0) < pl.col("output_ids").list.len()).then(pl.lit("stop"))
            .otherwise(pl.col("finish_reason")).alias("finish_reason")).drop("_e").write_parquet(part)


def schedule_agreeing(run_dir) -> None:
    """The ``schedule`` table's rows and tokens a tick recomputed from the steps (a test that
    fabricates steps keeps the engine's log agreeing, as the reader checks it tick by tick). Call
    before :func:`reseal`."""
    import json

    import polars as pl

    if not (run_dir / "schedule").is_dir():
        return
    meta = json.loads((run_dir / "run.json").read_text())
    steps = pl.read_parquet(sorted((run_dir / "steps").glob("part-*.parquet")))
    continuous = (meta.get("schedule") or {}).get("kind") == "continuous"
    size = meta["config"]["batch_size"]
    for part in sorted((run_dir / "schedule").glob("part-*.parquet")):
        sched = pl.read_parquet(part)
        own = steps if continuous else steps.filter(pl.col("request") // size == int(part.stem.split("-")[1]))
        per = own.group_by(pl.col("step").alias("tick")).agg(pl.len().alias("_n"), pl.col("emitted").sum().alias("_e"))
        sched.join(per, on="tick", how="left", maintain_order="left").with_columns(
            pl.col("_n").fill_null(0).cast(sched["batch_size"].dtype).alias("batch_size"),
            pl.col("_e").fill_null(0).cast(sched["emitted"].dtype).alias("emitted")).drop("_n", "_e").write_parquet(part)


def steps_agreeing(drafts, steps):
    """``steps`` with ``accepted``, ``kept`` and ``explored`` recomputed from ``drafts``' labels (a
    test that fabricates labels keeps the run's tables agreeing, as the run validator requires):
    accepted = drafts labelled 1, kept = drafts labelled, plus one never-verified draft is not kept."""
    import polars as pl

    g = drafts.group_by("request", "step").agg((pl.col("label") == 1).sum().alias("_a"),
                                               pl.col("label").is_not_null().sum().alias("_l"),
                                               (pl.col("label") == 0).sum().alias("_r"))
    s = steps.join(g, on=["request", "step"], how="left", maintain_order="left")
    # a step with a rejection verified through it (kept as before); one without kept only what was accepted
    kept = pl.when(pl.col("_r") > 0).then(pl.max_horizontal(pl.col("kept"), pl.col("_l"))).otherwise(pl.col("_a"))
    return s.with_columns(pl.col("_a").cast(pl.Int16).alias("accepted"), kept.cast(pl.Int16).alias("kept"),
                          pl.min_horizontal(pl.col("emitted"), pl.col("_a") + 1).cast(pl.Int16).alias("emitted")
                          ).with_columns((pl.col("kept") == pl.col("drafted")).alias("explored")).drop("_a", "_l", "_r")


@pytest.fixture(scope="session")
def dspark_run(tmp_path_factory, models_dir):
    """A real 12-request run of the built-in target drafted by the built-in DSpark (its confidence
    head logged with every draft), T = 1, continuous batches of 4."""
    from svt.collect import collect
    from svt.config import load_collect_config

    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "dspark"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")],
            "requests": 12, "batch_size": 4, "schedule": "continuous", "max_new_tokens": 40, "k": 4, "device": "cpu",
            "max_prompt_tokens": 256, "log": {"hidden": False, "dists_fraction": 0.0}}
    out = tmp_path_factory.mktemp("runs") / "dspark"
    collect(load_collect_config(None, base=base), out, progress=False)
    return out
