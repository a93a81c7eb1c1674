"""The run directory's lifecycle (svt.traces.rundir): a staged run replaces the old one only when it
is complete; an error or a Ctrl-C inside leaves the old run as it was and no staging folder."""

import pytest

from svt.traces.rundir import staging_path, swap_table, writing


def _old_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("old")
    return out


def test_a_completed_staged_run_replaces_the_old_one(tmp_path):
    out = _old_run(tmp_path)
    with writing(out, overwrite=True) as stage:
        assert stage == staging_path(out) and stage.is_dir() is False
        stage.mkdir()
        (stage / "run.json").write_text("new")
        assert (out / "run.json").read_text() == "old"  # not before the block ends
    assert (out / "run.json").read_text() == "new"
    assert not staging_path(out).exists()


@pytest.mark.parametrize("interruption", [ValueError, KeyboardInterrupt])
def test_an_interrupted_staged_run_leaves_the_old_one(tmp_path, interruption):
    out = _old_run(tmp_path)
    with pytest.raises(interruption):
        with writing(out, overwrite=True) as stage:
            stage.mkdir()
            (stage / "run.json").write_text("half")
            raise interruption
    assert (out / "run.json").read_text() == "old"
    assert not staging_path(out).exists()


def test_swap_table_replaces_one_table(tmp_path):
    out = _old_run(tmp_path)
    (out / "cache_drafts").mkdir()
    (out / "cache_drafts" / "part-00000.parquet").write_text("old")
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "part-00001.parquet").write_text("new")
    swap_table(out, "cache_drafts", staged)
    assert [p.name for p in (out / "cache_drafts").iterdir()] == ["part-00001.parquet"]
    assert not (out / ".cache_drafts.old").exists() and (out / "run.json").read_text() == "old"
