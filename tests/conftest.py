import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(2)

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("SVT_TEST_MODELS", ROOT / "data" / "models"))


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS


@pytest.fixture(scope="session")
def tiny_pair():
    """The built-in target with the weaker draft, in float32 (exactness tests belong in fp32)."""
    from svt.models import load_pair

    return load_pair(MODELS / "target", MODELS / "draft-small", device="cpu", dtype="float32")
