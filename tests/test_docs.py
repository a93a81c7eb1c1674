"""The manual builds (mkdocs, strict: no broken link, no missing page), the README's links resolve,
the README tour runs as written, and the worked examples of docs/extending.md work."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BIN = Path(sys.executable).parent


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def test_the_manual_builds_strictly(tmp_path):
    if not (BIN / "mkdocs").exists():
        pytest.skip("mkdocs is not installed (make setup installs it)")
    res = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("svt.collect.engines") > 0


def test_the_readme_is_a_front_door_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "the README links into the manual"
    missing = [link for link in links if not link.startswith("http") and not (REPO / link).exists()]
    assert not missing, missing
    assert "](#" not in text  # every section it points to lives in docs/


def tour_commands(text: str) -> list[str]:
    """The shell commands of the README's tour: its first bash block, comments dropped, continued
    lines joined."""
    tour = text.split("## A five-minute tour", 1)[1]
    block = fenced(tour, "bash")[0]
    block = re.sub(r"\\\n\s*", " ", block)
    lines = [line.split(" #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_tour_commands_are_parsed():
    cmds = tour_commands(README.read_text())
    assert cmds[0].startswith("svt collect") and any("--baseline" in c for c in cmds)


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path):
    """Every command of the tour, in order, in a scratch folder that sees the repository's configs
    and data; each must exit 0."""
    for name in ("configs", "data"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    for cmd in tour_commands(README.read_text()):
        argv = shlex.split(cmd)
        res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, f"{cmd}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    assert (tmp_path / "reports" / "tour-new" / "regression.md").is_file()


@pytest.mark.slow
def test_the_readme_traffic_section_runs_and_its_figures_are_what_it_measures(tmp_path):
    """The agent-log example as the README shows it, run from another folder (the config's paths
    are read from its own folder), and the speed-ups the README quotes."""
    text = README.read_text().split("## Your own traffic", 1)[1]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    for line in fenced(text, "bash")[0].splitlines():
        cmd = line.split(" #", 1)[0].strip()
        res = subprocess.run(shlex.split(cmd), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{cmd}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"

    def speedups(report):
        rows = json.loads(report.read_text())["hvd"]["rows"]
        return {r["policy"]: round(r["speedup_vs_greedy"], 2) for r in rows if r["group"] == "all"
                and "predictor" not in r}

    got = speedups(tmp_path / "reports" / "agent" / "report.json")
    assert json.loads((tmp_path / "reports" / "agent" / "report.json").read_text())["runs"][0]["counts"]["requests"] == 24
    quoted = re.search(r"cache-only decoding is\s+([\d.]+)x greedy \(model-only ([\d.]+)x, the oracle switch ([\d.]+)x\)"
                       r" over the 24 turns, against ([\d.]+)x when only", text)
    assert quoted, "the README quotes the speed-ups"
    # one decimal: the replay charges each cache lookup its measured time (the second decimal moves)
    for policy, value in zip(("cache-only", "model-only", "oracle-switch"), quoted.groups()[:3], strict=True):
        assert abs(got[policy] - float(value)) <= 0.06, (policy, got[policy], value)
    last = [["svt", "collect", "examples/traffic/agent.yaml", "--out", "runs/last", "--set", "turns=last",
             "--workload", "examples/traffic/agent-log.jsonl"],
            ["svt", "evaluate", "runs/last", "--out", "reports/last", "--costs", "configs/costs/h100-llama8b-eagle.yaml"]]
    for argv in last:
        assert subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=300).returncode == 0
    assert abs(speedups(tmp_path / "reports" / "last" / "report.json")["cache-only"] - float(quoted.group(4))) <= 0.06


def test_the_extending_examples_work(tmp_path):
    """The feature and the fitter of docs/extending.md, run in a fresh interpreter (registering
    them must not leak into the other tests): the fitter fits, predicts and round-trips its file."""
    blocks = fenced((REPO / "docs" / "extending.md").read_text(), "python")
    feature, fitter = blocks[0], blocks[1]
    (tmp_path / "my_feats.py").write_text(feature)
    (tmp_path / "shifted.py").write_text(fitter)
    script = """
import numpy as np, polars as pl
import my_feats, shifted
from svt.features import get_feature
from svt.fit.base import FitData, get_fitter
assert get_feature("qmax_sq").lossless
rng = np.random.default_rng(0)
q = rng.uniform(0.05, 0.95, 4000)
frame = pl.DataFrame({"q_max": q, "label": (rng.uniform(size=q.size) < q * 0.8).astype(np.int8),
                      "position": np.zeros(q.size, dtype=np.int16)})
est = get_fitter("shifted")().fit(FitData(frame, k=3))
p = est.predict(frame)
assert abs(p.mean() - frame["label"].mean()) < 0.05, (p.mean(), frame["label"].mean())
again = type(est).from_dict(est.to_dict())
assert np.allclose(again.predict(frame), p)
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_the_section_example_adds_a_judged_metric(small_run, tmp_path):
    """The report section of docs/extending.md, in a fresh interpreter: evaluate writes it, report.md
    shows it, and the regression report judges its metric in its direction."""
    block = next(b for b in fenced((REPO / "docs" / "extending.md").read_text(), "python") if "class Verified" in b)
    (tmp_path / "verified.py").write_text(block)
    script = f"""
import copy
import polars as pl
import verified
from svt.report import evaluate, to_markdown, sections
from svt.report.compare import compare_reports
from svt.traces import open_run
sections.SECTIONS.insert(2, verified.Verified())
report = evaluate([{str(small_run)!r}])
d = open_run({str(small_run)!r}).scan("drafts").select(pl.col("label").is_not_null().mean()).collect().item()
assert abs(report["verified"]["verified_share"] - d) < 1e-12
assert "## Verified drafts" in to_markdown(report)
rows = [r for r in compare_reports(report, report)["rows"] if r["metric"] == "verified_share"]
assert [r["verdict"] for r in rows] == ["unchanged"]
worse = copy.deepcopy(report)
worse["verified"]["verified_share"] -= 0.05
rows = [r for r in compare_reports(report, worse)["rows"] if r["metric"] == "verified_share"]
assert [r["verdict"] for r in rows] == ["regressed"]
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_the_importer_example_imports(tmp_path):
    """The format of docs/guide/interop.md's "Adding a format", in a fresh interpreter: one module,
    one registry line, and svt import writes a run whose labels follow the counts."""
    block = next(b for b in fenced((REPO / "docs" / "guide" / "interop.md").read_text(), "python")
                 if "class MyFormat" in b)
    (tmp_path / "my_format.py").write_text(block)
    (tmp_path / "in.jsonl").write_text('{"accepted": [4, 1]}\n{"accepted": [0]}\n')
    script = f"""
import json
from svt import interop
from svt.traces import open_run
interop.IMPORTERS["my-format"] = "my_format:MyFormat"
s = interop.import_trace("my-format", {str(tmp_path / "in.jsonl")!r}, {str(tmp_path / "run")!r})
assert (s.requests, s.steps, s.drafts, s.labelled, s.accepted) == (2, 3, 12, 7, 5), s
lacks = json.load(open({str(tmp_path / "run" / "run.json")!r}))["import"]["lacks"]
assert "q_max" in lacks["drafts"] and "prompt_ids" in lacks["requests"], lacks
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
