import pytest

from svt.config import load_collect_config, parse_set
from svt.errors import ConfigError

BASE = {"target": "t", "draft": "d", "workloads": ["code"]}


def test_defaults_and_overrides():
    cfg = load_collect_config(None, parse_set(["temperature=0", "log.hidden=true", "k=3"]), base=BASE)
    assert cfg.temperature == 0.0 and cfg.log.hidden is True and cfg.k == 3 and cfg.top_p == 1.0


def test_yaml_file_and_single_workload_string(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("target: a\ndraft: b\nworkloads: prose\nrequests: 3\n")
    cfg = load_collect_config(f, {"seed": 5})
    assert cfg.workloads == ["prose"] and cfg.requests == 3 and cfg.seed == 5


@pytest.mark.parametrize("over, msg", [
    ({"tempreature": 1}, "Unknown config key `tempreature`"),
    ({"log": {"hiden": True}}, "Unknown config key `log.hiden`"),
    ({"k": -1}, "Expected `k` to be an integer in"),
    ({"k": 0, "av": {"fit": "f.json", "costs": "c.yaml"}}, "Expected `k` to be at least 1 for a run with av"),
    ({"k": 0, "log": {"hidden": True}}, "Expected `log` to be without hidden states"),
    ({"schedule": "dynamic"}, "Expected `schedule` to be static or continuous"),
    ({"schedule": "continuous", "engine": "reference"}, "Expected `schedule` to be static for live HVD"),
    ({"k": "five"}, "Expected `k` to be an integer"),
    ({"top_p": 0}, "Expected `top_p` to be a number in"),
    ({"temperature": -1}, "Expected `temperature`"),
    ({"log": {"dists_fraction": 2}}, "log.dists_fraction"),
])
def test_bad_values_get_one_clear_message(over, msg):
    with pytest.raises(ConfigError, match=msg):
        load_collect_config(None, over, base=BASE)


def test_missing_required_key():
    with pytest.raises(ConfigError, match="Missing required config key `target`"):
        load_collect_config(None, {}, base={"draft": "d", "workloads": ["x"]})
    with pytest.raises(ConfigError, match="Expected `draft` to be a model directory"):
        load_collect_config(None, {}, base={"target": "t", "workloads": ["x"]})


def test_bad_set_syntax_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        parse_set(["temperature"])
    with pytest.raises(ConfigError, match="not found"):
        load_collect_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_collect_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_config_file_says_it_is_empty(tmp_path, text):
    """It said "Missing required config key `target`", pointing at a key instead of the file."""
    from svt.config import load_collect_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match="the file is empty"):
        load_collect_config(cfg)
