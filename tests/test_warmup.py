"""``python -m svt.warmup`` (run by ``make setup``) compiles every kernel the demo's fit and evaluate
reach, so their first use loads it from the cache instead of compiling it."""

import os
import subprocess
import sys

import pytest

# the kernels that svt fit / svt evaluate with fits, groups, bootstrap and --costs compile, and those
# of a run too large for a second key array
ENTRY_KERNELS = {
    "identity_kernel.identity_columns", "irls_kernel.replay", "ordered_kernel.count_groups",
    "ordered_kernel.ordered_scan", "ordered_kernel.group_start", "radix_kernel._histograms", "radix_kernel._scatter", "radix_kernel.msd_sort_segments",
    "ranks_kernel.float32_keys", "ranks_kernel.segment_start", "ranks_kernel.fill_float32", "ranks_kernel.dense_ranks",
    "ranks_kernel.has_ranks", "sums_kernel.score_sums", "steps_kernel.step_sums", "steps_kernel.step_heads", "replay_kernel.av_kept",
    "replay_kernel.av_length_kept", "replay_kernel.draft_lengths_all", "replay_kernel.oracle_steps",
}


@pytest.mark.slow
def test_warmup_compiles_every_kernel_into_the_cache(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "HF_HUB_OFFLINE": "1",
           "TMPDIR": str(tmp_path / "tmp")}
    res = subprocess.run([sys.executable, "-m", "svt.warmup"], env=env, capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout == ""  # quiet: make setup prints its one line (stderr)
    assert "svt kernels compiled" in res.stderr
    compiled = {p.name.split("-")[0] for p in (tmp_path / "numba").rglob("*.nbc")}
    assert ENTRY_KERNELS <= compiled, sorted(ENTRY_KERNELS - compiled)
    assert not list((tmp_path / "tmp").glob("svt-warmup-*"))  # its run and reports were temporary


def test_a_failed_step_is_an_error_and_main_warns(monkeypatch, capsys):
    import svt.cli
    from svt import warmup

    monkeypatch.setattr(svt.cli, "app", lambda argv, standalone_mode: 2)  # an svt error's exit code
    with pytest.raises(RuntimeError, match="svt collect exited with 2"):
        warmup.warm()
    assert warmup.main() == 1
    assert "warning: svt's kernels were not compiled ahead" in capsys.readouterr().err
