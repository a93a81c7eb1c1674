"""DFlash and DSpark directories: the published form written in full, read back exactly (block_size
at the top level or under `dflash_config`), and a checkpoint that does not fit its target refused
with one message naming the field."""

import json

import pytest
import torch
from safetensors.torch import load_file

from svt.errors import ModelLoadError
from svt.models.block import build_target_layer_ids, save_block
from svt.models.heads import load_block
from svt.models.train_block import make_block


@pytest.fixture(scope="module")
def target(tiny_pair):
    return tiny_pair.target


def test_the_published_layer_rule_and_why_svt_taps_other_layers():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # evenly from 1 to N - 3
    assert build_target_layer_ids(4, 3) == [1, 1, 1]  # a 4-layer target: one id three times
    assert build_target_layer_ids(4, 1) == [2]


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_saved_in_the_published_form_and_read_back_exactly(target, tmp_path, kind):
    torch.manual_seed(0)
    model = make_block(target, kind, mask_token_id=7).eval()
    save_block(model, tmp_path / kind, dtype=torch.float32)
    cfg = json.loads((tmp_path / kind / "config.json").read_text())
    layout = cfg["dflash_config"]
    assert cfg["architectures"] == [{"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}[kind]]
    assert layout["target_layer_ids"] == [0, 1, 2] and layout["mask_token_id"] == 7
    assert cfg["block_size"] == layout["block_size"] == (6 if kind == "dflash" else 5)
    names = set(load_file(str(tmp_path / kind / "model.safetensors")))
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in names)  # the target's, shared
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    if kind == "dspark":
        assert layout["sample_from_anchor"] is True and layout["markov_head_type"] == "vanilla"
        assert layout["enable_confidence_head"] is True and layout["confidence_head_with_markov"] is True
        assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                "confidence_head.proj.bias"} <= names
    loaded = load_block(tmp_path / kind, target)
    assert loaded.cfg.n_drafts == 5 and loaded.kind == kind
    for (n, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(loaded.state_dict().items()), strict=True):
        assert torch.equal(a, b), n
    # the older form: block_size at the top level only
    del cfg["dflash_config"]["block_size"]
    (tmp_path / kind / "config.json").write_text(json.dumps(cfg))
    assert load_block(tmp_path / kind, target).cfg.block_size == cfg["block_size"]


def _edit(tmp_path, target, change, kind="dspark"):
    model = make_block(target, kind, mask_token_id=7)
    save_block(model, tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    change(cfg)
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "d"


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c.update(hidden_size=128), "`hidden_size` = 128, but the target's is 256"),
    # found by probing: a wrong type was a traceback, or a message that contradicted itself
    (lambda c: c["dflash_config"].update(block_size="x"), "expected `block_size` to be an integer"),
    (lambda c: c["dflash_config"].update(mask_token_id=None), "expected `mask_token_id` to be an integer"),
    (lambda c: c.update(hidden_size="256"), "expected `hidden_size` to be an integer"),
    (lambda c: c["dflash_config"].update(target_layer_ids="abc"), "non-empty list of layer ids"),
    (lambda c: c.update(vocab_size=4096), "`vocab_size` = 4096"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[0, 1, 4]), r"`target_layer_ids` \[0, 1, 4\]"),
    (lambda c: c["dflash_config"].update(mask_token_id=2048), "`mask_token_id` 2048 is outside the vocabulary"),
    (lambda c: (c["dflash_config"].pop("sample_from_anchor"), c.pop("sample_from_anchor")),
     "must say `sample_from_anchor`"),
    (lambda c: (c["dflash_config"].pop("block_size"), c.pop("block_size")), "has no `block_size`"),
    (lambda c: c["dflash_config"].update(markov_head_type="gated"), "vanilla Markov head only"),
    (lambda c: (c["dflash_config"].update(markov_rank=32), c.update(markov_rank=32)), "but its config needs"),
])
def test_a_checkpoint_that_does_not_fit_its_target_is_one_error_naming_the_field(target, tmp_path, change, message):
    with pytest.raises(ModelLoadError, match=message):
        load_block(_edit(tmp_path, target, change), target)


def test_a_drafter_bound_to_another_target_is_refused_by_name(tmp_path, models_dir):
    """svt records the target a drafter was trained on; another target (even of the same shape) is
    one error naming both weights hashes."""
    from svt.models import load_pair
    from svt.models.loading import weights_hash

    pair = load_pair(models_dir / "target", models_dir / "draft-small", device="cpu", dtype="bfloat16")
    ok = tmp_path / "ok"
    save_block(make_block(pair.target, "dspark", mask_token_id=7), ok,
               extra={"svt_target_weights_sha256_16": weights_hash(models_dir / "target")})
    assert load_pair(models_dir / "target", ok, device="cpu", dtype="bfloat16").draft_kind == "dspark"
    other = tmp_path / "other"
    save_block(make_block(pair.target, "dspark", mask_token_id=7), other,
               extra={"svt_target_weights_sha256_16": "0123456789abcdef"})
    with pytest.raises(ModelLoadError, match="trained on a target with weights 0123456789abcdef"):
        load_pair(models_dir / "target", other, device="cpu", dtype="bfloat16")


def test_a_collection_refuses_a_block_larger_k_and_trees(tmp_path, models_dir):
    """k above the block's draft slots, and draft trees, are one message each."""
    from svt.collect import collect
    from svt.config import load_collect_config
    from svt.errors import ConfigError
    from svt.models import load_pair

    pair = load_pair(models_dir / "target", models_dir / "draft-small", device="cpu", dtype="bfloat16")
    save_block(make_block(pair.target, "dflash", mask_token_id=7), tmp_path / "dflash")
    base = {"target": str(models_dir / "target"), "draft": str(tmp_path / "dflash"), "workloads": ["code"],
            "requests": 2, "max_new_tokens": 8, "device": "cpu"}
    with pytest.raises(ConfigError, match="block has 5 draft slots"):
        collect(load_collect_config(None, base={**base, "k": 6}), tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="Remove `tree`"):
        collect(load_collect_config(None, base={**base, "k": 3, "batch_size": 1, "tree": {"widths": [2, 2]}}),
                tmp_path / "b", progress=False)
