"""Check, then lock, is a race (issue 53): every writer checks its --out *while holding* the output
lock. Two writers to one new --out without --overwrite give one output and one refusal, whatever
the interleaving.

The deterministic test replays the interleaving that loses data when the check runs before the
lock: writer B has passed whatever it checks before it asks for the lock; writer A then runs from
start to end; B takes the lock. A writer that does not repeat its checks under the lock writes over
A's output and prints "wrote"; a correct one refuses. The stress test starts two real processes
many times and counts the outcomes."""

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import svt.fileio
from svt.cli import app
from svt.fileio import output_lock
from svt.vllm_plugin.recorder import Recorder

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "interop" / "fixtures"
runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def _rival_runs_first(monkeypatch, rival):
    """The first output lock taken is preceded by ``rival()`` run to its end (its own locks are
    the real ones): B has checked, A writes, then B locks."""
    real = svt.fileio.output_lock
    fired = []

    @contextlib.contextmanager
    def lock(out):
        if not fired:
            fired.append(out)
            with monkeypatch.context() as m:
                m.setattr(svt.fileio, "output_lock", real)
                rival()
        with real(out):
            yield

    monkeypatch.setattr(svt.fileio, "output_lock", lock)
    return fired


@pytest.fixture(scope="module")
def tiny_config(models_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("racecfg") / "c.yaml"
    path.write_text(yaml.safe_dump({
        "target": str(models_dir / "target"), "draft": str(models_dir / "draft-small"),
        "workloads": [str(ROOT / "data" / "workloads" / "code.jsonl")], "requests": 2, "batch_size": 1,
        "max_new_tokens": 4, "k": 2, "device": "cpu", "seed": 3}))
    return path


@pytest.fixture(scope="module")
def shards(tiny_config, tmp_path_factory):
    d = tmp_path_factory.mktemp("raceshards")
    for i in range(2):
        r = _cli("collect", tiny_config, "--out", d / f"s{i}", "--shard", f"{i}/2", "--quiet")
        assert r.exit_code == 0, r.output
    return [d / "s0", d / "s1"]


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    from tests.vllm_plugin.test_recorder import _engine

    d = tmp_path_factory.mktemp("racespool") / "trace"
    _engine(Recorder(d))
    return d


def _writers(small_run, tiny_config, shards, spool, tmp_path):
    """name -> (command writing OUT, what a refusal says): the two writers differ where they can."""
    vs, sd = FIX / "vllm_steps.jsonl", FIX / "specdec_tokens.jsonl"
    return {
        "import": (lambda out, i: ("import", "vllm-steps" if i == 0 else "specdec-tokens", vs if i == 0 else sd,
                                   "--out", out), "exists and is not empty"),
        "merge": (lambda out, i: ("merge", *shards[::1 if i == 0 else -1], "--out", out), "exists and is not empty"),
        "vllm-finish": (lambda out, i: ("vllm-finish", spool, "--out", out), "exists and is not empty"),
        "collect": (lambda out, i: ("collect", tiny_config, "--out", out, "--quiet", "--set", f"seed={i}"),
                    "is not empty"),
        "evaluate": (lambda out, i: ("evaluate", small_run, "--out", out, "--feature", "q_max" if i == 0 else "position",
                                     "--bootstrap", "0"), "already holds a report"),
        "export": (lambda out, i: ("export", "profile", small_run, "--out", out.with_suffix(".json")), "exists"),
        "fit": (lambda out, i: ("fit", small_run, "--model", "logistic" if i == 0 else "irls-online",
                                "--out", out.with_suffix(".json")), "exists"),
    }


@pytest.mark.parametrize("writer", ["import", "merge", "vllm-finish", "collect", "evaluate", "export", "fit"])
def test_a_writer_that_checked_before_a_rival_wrote_is_refused_under_the_lock(
        writer, small_run, tiny_config, shards, spool, tmp_path, monkeypatch):
    command, refusal = _writers(small_run, tiny_config, shards, spool, tmp_path)[writer]
    out = tmp_path / "out"
    written = out.with_suffix(".json") if writer in ("export", "fit") else out
    results = {}

    def rival():
        results["A"] = _cli(*command(out, 0))

    fired = _rival_runs_first(monkeypatch, rival)
    results["B"] = _cli(*command(out, 1))
    assert fired, "the writer took no output lock"
    assert results["A"].exit_code == 0, results["A"].output
    before = sorted((p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
    assert results["B"].exit_code == 2 and refusal in results["B"].output, results["B"].output
    assert "wrote" not in results["B"].output
    assert written.exists()
    after = sorted((p.relative_to(tmp_path), p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
    assert after == before  # A's output is whole


def test_svt_cache_holds_its_run_while_it_writes(greedy_run):
    with output_lock(greedy_run):  # e.g. a collect --overwrite of the same run
        r = _cli("cache", greedy_run)
    assert r.exit_code == 2 and "being written by another svt command" in r.output, r.output


def test_two_import_processes_started_together_give_one_run_and_one_refusal(tmp_path):
    vs, sd = FIX / "vllm_steps.jsonl", FIX / "specdec_tokens.jsonl"
    for round_ in range(6):
        out = tmp_path / f"run{round_}"
        procs = [subprocess.Popen([sys.executable, "-m", "svt.cli", "import", fmt, str(src), "--out", str(out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for fmt, src in (("vllm-steps", vs), ("specdec-tokens", sd))]
        outputs = [(p.wait(timeout=120), p.stdout.read()) for p in procs]
        codes = sorted(c for c, _ in outputs)
        assert codes == [0, 2], outputs
        refused = next(text for c, text in outputs if c == 2)
        assert "being written by another" in refused or "exists and is not empty" in refused, refused
        assert (out / "run.json").is_file()
