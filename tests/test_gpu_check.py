"""scripts/gpu_check.sh: one line and exit 0 where there is no GPU; its CPU dry run (every step on
the tiny sizes) passes end to end and writes its summary, so the script cannot rot before a task is
lent a GPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

from .conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(tmp_path, **env):
    full = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_WHEELS": str(tmp_path / "no-wheels"),
            "PYTHON": sys.executable, **env}
    full.pop("SVT_TEST_DEVICE", None)
    return subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    res = _run(tmp_path)
    assert res.returncode == 0
    assert res.stdout.strip().splitlines() == [res.stdout.strip()] and "no CUDA GPU" in res.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cpu_dry_run_passes_every_step(tmp_path):
    res = _run(tmp_path, GPU_CHECK_DEVICE="cpu", GPU_CHECK_PYTEST_ARGS="-k head_trains")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["all_passed"]
    assert [s["step"] for s in summary["steps"]] == ["env", "tests", "random-pair", "costs-tiny", "costs-random",
                                                     "bench-collect", "live-replay", "reference-head",
                                                     "reference-head-report"]
    assert "no served model and head to run a reference run on" in res.stdout
    assert (tmp_path / "out" / "reference-head" / "report.json").is_file()
    assert {(p["policy"], p["batch"]) for p in summary["live"]} == {(f"fixed K={k}", b) for k in (0, 1) for b in (1, 2)}
    assert set(summary["costs"]) == {"costs-builtin", "costs-random-tiny"}
    assert summary["bench_collect"]["device"] == "cpu" and "1 passed" in " ".join(summary["tests_tail"])
    assert (tmp_path / "out" / "summary.md").read_text().startswith("# svt GPU check")
    assert not (tmp_path / "out" / "work").exists()  # the random weights are not kept
    import yaml

    for name in ("costs-builtin", "costs-random-tiny"):  # the dry run profiles batch sizes 1 and 2 only
        table = yaml.safe_load((tmp_path / "out" / f"{name}.yaml").read_text())
        assert sorted(table["draft_ms"]) == [1, 2]


@pytest.mark.parametrize("args, match", [
    (["--profile-costs", "--profile-batches", "1,x"], "integers separated by commas"),
    (["--profile-costs", "--profile-batches", "0,2"], "distinct batch sizes"),
    (["--profile-costs", "--profile-batches", "2,2"], "distinct batch sizes"),
    (["--profile-batches", "1,2"], "goes with --profile-costs"),
])
def test_bad_profile_batches_are_refused(tmp_path, args, match):
    from typer.testing import CliRunner

    from svt.cli import app

    out = tmp_path / "costs.yaml"
    res = CliRunner().invoke(app, ["collect", str(ROOT / "configs" / "collect" / "demo.yaml"), "--out", str(out),
                                   *args])
    assert res.exit_code != 0 and match in res.output and "Traceback" not in res.output
    assert not out.exists()
