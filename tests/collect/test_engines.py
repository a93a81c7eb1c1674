"""Collection engines are looked up by name (svt.collect.engines): each registered class imports,
names itself, and refuses the options it does not support before anything is written."""

from pathlib import Path

import pytest

from svt.collect.engines import Engine, collect, engine_name, get_engine
from svt.config import ENGINES, load_collect_config
from svt.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_registered_engine_imports_and_names_itself(name):
    engine = get_engine(name)
    assert isinstance(engine, Engine) and engine.name == name


def test_an_unknown_engine_is_one_message():
    with pytest.raises(ConfigError, match="Unknown engine 'nope'"):
        get_engine("nope")


def test_the_hvd_section_selects_the_hvd_engine():
    cfg = load_collect_config(REPO / "configs" / "collect" / "demo.yaml", {"temperature": 0, "batch_size": 1})
    assert engine_name(cfg) == "svt"
    cfg.hvd = object()
    assert engine_name(cfg) == "hvd"


@pytest.mark.parametrize("option", [{"resume": True}, {"shard": (0, 2)}])
def test_whole_run_engines_refuse_resume_and_shard_before_writing(tmp_path, option):
    cfg = load_collect_config(REPO / "configs" / "collect" / "hvd-reference.yaml")
    with pytest.raises(ConfigError, match="collects whole runs"):
        collect(cfg, tmp_path / "out", config_path=REPO / "configs" / "collect" / "hvd-reference.yaml", **option)
    assert not (tmp_path / "out").exists()
