"""The random pair of a realistic shape (for GPU timing): loadable through svt's own loading code,
with the built-in tokenizer, of the stated shapes."""

import json

from svt.models import load_pair
from svt.models.random_pair import SHAPES, make_pair


def test_tiny_random_pair_loads_and_has_its_shapes(tmp_path):
    counts = make_pair(tmp_path, "tiny")
    pair = load_pair(tmp_path / "target", tmp_path / "draft", device="cpu")
    ident = pair.identity()
    assert ident["target"]["parameters"] == counts["target"] and ident["draft"]["parameters"] == counts["draft"]
    for role in ("target", "draft"):
        cfg = json.loads((tmp_path / role / "config.json").read_text())
        for key, value in SHAPES["tiny"][role].items():
            assert cfg[key] == value
        assert cfg["vocab_size"] == SHAPES["tiny"]["vocab"] >= len(pair.tokenizer)
