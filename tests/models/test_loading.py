import json
import shutil

import pytest
import torch

from svt.errors import ModelLoadError
from svt.models import load_pair, resolve_device
from svt.models.loading import resolve_dtype


def test_pair_loads_from_local_paths(tiny_pair, models_dir):
    ident = tiny_pair.identity()
    assert ident["target"]["parameters"] > ident["draft"]["parameters"]
    assert len(ident["target"]["weights_sha256_16"]) == 16
    assert tiny_pair.target.dtype == torch.float32 and not tiny_pair.target.training


def test_missing_directory_and_config(tmp_path, models_dir):
    with pytest.raises(ModelLoadError, match="is not one"):
        load_pair(tmp_path / "nope", models_dir / "draft-small")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="has none"):
        load_pair(models_dir / "target", tmp_path / "empty")


def test_mismatched_tokenizers_are_refused(tmp_path, models_dir):
    other = tmp_path / "other"
    shutil.copytree(models_dir / "draft-small", other)
    tj = other / "tokenizer.json"
    data = json.loads(tj.read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same tokens, different ids
    tj.write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="share one tokenizer"):
        load_pair(models_dir / "target", other, device="cpu")


def test_device_and_dtype_checks():
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ModelLoadError, match="auto, cpu or cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="sees no GPU"):
            resolve_device("cuda")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ModelLoadError, match="dtype"):
        resolve_dtype("float8", torch.device("cpu"))


def _copy(models_dir, tmp_path, name="target"):
    dst = tmp_path / name
    shutil.copytree(models_dir / name, dst)
    return dst


def test_a_config_claiming_more_layers_than_the_weights_hold_is_refused(tmp_path, models_dir):
    target = _copy(models_dir, tmp_path)
    cfg = json.loads((target / "config.json").read_text())
    cfg["num_hidden_layers"] += 1  # transformers would give the fifth layer random weights
    (target / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"target checkpoint .* 9 missing from the weights .*model\.layers\.4\."):
        load_pair(target, models_dir / "draft-small", device="cpu")


def test_weights_the_model_does_not_have_are_refused(tmp_path, models_dir):
    from safetensors.torch import load_file, save_file

    draft = _copy(models_dir, tmp_path, "draft-small")
    state = load_file(draft / "model.safetensors")
    state["model.layers.7.mlp.up_proj.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)
    save_file(state, draft / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"draft checkpoint .* 1 in the weights but not in the model"):
        load_pair(models_dir / "target", draft, device="cpu")


def test_a_head_without_its_architecture_is_not_loaded_as_a_random_model(tmp_path, models_dir):
    """An EAGLE-3 directory whose config lost `architectures` is no head to svt; loaded as a plain
    Llama model, none of its weights fit: refused, not run with random layers."""
    head = _copy(models_dir, tmp_path, "eagle3")
    cfg = json.loads((head / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (head / "config.json").write_text(json.dumps(cfg))
    shutil.copy(models_dir / "target" / "tokenizer.json", head / "tokenizer.json")
    with pytest.raises(ModelLoadError, match="does not match its config.json"):
        load_pair(models_dir / "target", head, device="cpu")
