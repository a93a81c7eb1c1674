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
