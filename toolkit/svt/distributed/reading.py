"""A run read deeply on a cluster: what :func:`svt.traces.open_run` checks on one machine, shard by
shard on the workers, so the driver reads no drafts.

The driver opens the run shallowly (run.json, every shard's columns and types, the shards against
run.json's record of them). Each worker then takes the shards of one name (one of each table: every
svt writer writes one shard per batch and table) and checks their values and their SHA-256 against
run.json, the cross-table checks of :mod:`svt.traces.derived` on that pair, the drafts' last
position, and returns the drafts' data identity (:class:`svt.traces.identity.Identity`: order-free
sums, merged by addition on the driver). A run whose tables do not pair by name is checked across
tables on the driver instead (reading them whole, as one machine does), and so is a run where a pair
shows a problem (a step split over two shards looks wrong in each): what is checked and the words of
each refusal are the single machine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def check_unit(unit: dict, meta: dict, lacks: dict, shas: dict, requests: list[str] | None, derived: bool,
               identity_table: str | None) -> dict:
    """On a worker: the deep read of one name's shards (``unit``: table -> file)."""
    import polars as pl

    from svt.traces.derived import part_problem
    from svt.traces.identity import Identity
    from svt.traces.io import check_shard_deep, scan_shard

    for table, f in unit.items():
        check_shard_deep(f, table, frozenset(lacks.get(table, [])), shas.get(f))
    parts = {t: scan_shard(f, t) for t, f in unit.items()}
    problem = None
    if derived:
        # the unit's own requests shard (every svt writer pairs them by name; a request found in another
        # shard is a problem here, and the driver then reads the run whole), else the whole table
        own = [unit["requests"]] if "requests" in unit else requests
        req = pl.concat([scan_shard(f, "requests") for f in own]) if own else None
        problem = part_problem(meta, set(lacks.get("drafts", [])), parts, req)
    # the requests this unit's steps decode: a request in two units' steps is checked on the whole run
    stepped = (parts["steps"].select(pl.col("request").unique()).collect()["request"].to_list()
               if "steps" in parts else [])
    top = parts["drafts"].select(pl.col("position").max()).collect().item() if "drafts" in parts else None
    ident = Identity(identity_table)
    if identity_table in parts:
        ident.add(parts[identity_table])
    return {"problem": problem, "top": top, "identity": ident, "stepped": stepped}


@dataclass
class RunCheck:
    """A run opened shallowly on the driver and what its workers need to read it deeply: one task
    (:meth:`task`, for :func:`check_unit`) per shard name; :meth:`finish` takes their results."""

    path: Path
    run: object
    units: dict
    args: tuple

    @classmethod
    def open(cls, path: str | Path, read: str | None = None) -> RunCheck:
        """``read``: the table whose identity a fit records (the one it read), where the run has rows in it."""
        from svt.traces.io import open_run

        path = Path(path)
        run = open_run(path, deep=False)
        recs = run.meta.get("shards") if isinstance(run.meta.get("shards"), dict) else {}
        units: dict[str, dict] = {}
        shas, lacks = {}, {}
        for table, files in run.shards.items():
            lacks[table] = run.lacks(table)
            for f in files:
                units.setdefault(f.name, {})[table] = str(f)
                shas[str(f)] = ((recs.get(table) or {}).get(f.name) or {}).get("sha256")
        chain = "tree_drafts" if isinstance(run.meta.get("tree"), dict) else "drafts"
        names = {t: [f.name for f in fs] for t, fs in run.shards.items()}
        derived = not run.has("steps") or names.get(chain, []) == names["steps"]
        requests = [str(f) for f in run.shards.get("requests", [])] or None
        from svt.traces.identity import identity_table

        ident_table = identity_table(run, read)
        return cls(path, run, units, (run.meta, lacks, shas, requests, derived, ident_table))

    def task(self, name: str) -> tuple:
        """:func:`check_unit`'s arguments for the shards named ``name``."""
        return (self.units[name], *self.args)

    def finish(self, got: dict) -> dict:
        """The checks across shards, from every name's :func:`check_unit` result (``got``: name ->
        result); the run's data identity."""
        from svt.traces.derived import check_derived, check_run_whole
        from svt.traces.identity import Identity
        from svt.traces.io import check_top_position

        if set(got) != set(self.units):
            raise ValueError(f"{self.path}: shards left unchecked: {sorted(set(self.units) - set(got))[:3]}")
        tops = [g["top"] for g in got.values() if g["top"] is not None]
        if self.run.has("drafts"):
            check_top_position(self.path, self.run.meta, max(tops) if tops else None)
        # tables that do not pair by name, or a problem found in a pair (a step split over two shards
        # looks wrong in each): the cross-table checks read the tables whole, as on one machine
        stepped = [r for g in got.values() for r in g.get("stepped", [])]
        if not self.args[4] or any(g["problem"] for g in got.values()) or len(set(stepped)) != len(stepped):
            check_derived(self.run)
        else:  # the checks only whole tables can make (check_derived makes them too)
            check_run_whole(self.run)
        identity = Identity(self.args[5])
        for name in sorted(got):
            identity.merge(got[name]["identity"])
        return {"table": self.args[5], **identity.result()}


def run_check(task: tuple) -> dict:
    return check_unit(*task)


def read_run(path: str | Path, engine, table: str | None = None):
    """The run at ``path`` opened and read deeply on ``engine``'s workers: ``(run, identity)``, the
    :class:`svt.traces.io.Run` and the data identity :func:`svt.traces.identity.run_identity`
    gives."""
    check = RunCheck.open(path, table)
    names = sorted(check.units)
    got = engine.map(run_check, [check.task(n) for n in names])
    return check.run, check.finish(dict(zip(names, got, strict=True)))
