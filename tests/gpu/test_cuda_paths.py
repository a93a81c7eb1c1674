"""The CUDA paths, run by `scripts/gpu_check.sh` on a GPU (`pytest -m cuda`). On a machine without
one they are skipped, unless ``SVT_TEST_DEVICE=cpu`` runs the same tests on the CPU (the script's
dry run, which keeps them from rotting).

Each is the CPU suite's check on the device: the collector's greedy output equals plain greedy
decoding (float32 exactly; bfloat16 on its first tokens, where kernels' reduction order may flip
a near-tie later), sampled first tokens follow the target exactly (chi-square against enumeration),
logged features under padded batched KV caches equal fresh forwards, live HVD equals its replay, and
the confidence head trains on the device."""

import json
import os

import numpy as np
import pytest
import torch

from svt.collect.engine import SamplingParams, run_batch

from ..collect.test_engine import PROMPTS
from ..conftest import MODELS, ROOT

DEVICE = os.environ.get("SVT_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                                 reason="no CUDA GPU: scripts/gpu_check.sh runs these on one")]


def _pair(dtype):
    from svt.models import load_pair

    return load_pair(MODELS / "target", MODELS / "draft-large", device=DEVICE, dtype=dtype)


@torch.inference_mode()
def _plain_greedy(model, ids, n):
    seq = torch.tensor([ids], device=model.device)
    out = model.generate(seq, attention_mask=torch.ones_like(seq), do_sample=False, max_new_tokens=n,
                         min_new_tokens=n, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("dtype, exact_tokens", [("float32", 40), ("bfloat16", 8)])
def test_collector_greedy_equals_generate(dtype, exact_tokens):
    pair = _pair(dtype)
    tok = pair.tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in PROMPTS]  # different lengths: padded batch
    g = torch.Generator(device=pair.device).manual_seed(0)
    log = run_batch(pair.target, pair.draft, prompts, SamplingParams(0.0, 1.0, 4, 40), eos_id=None,
                    pad_id=tok.pad_token_id, generator=g)
    for ids, got in zip(prompts, log.outputs, strict=True):
        want = _plain_greedy(pair.target, ids, 40)
        assert got[:exact_tokens] == want[:exact_tokens]
        if dtype == "float32":
            assert got == want


def test_logged_features_under_padded_batches_equal_fresh_forwards():
    """p_sampled, q_sampled and q_max of every labelled draft of a padded batch equal one unbatched
    forward on its prefix, on the device (float32): the KV caches' holes and positions are exact."""
    from ..collect.test_engine import assert_logged_features_match_fresh_forwards

    pair = _pair("float32")
    g = torch.Generator(device=pair.device).manual_seed(1)
    checked = assert_logged_features_match_fresh_forwards(pair.target, pair.draft, pair.tokenizer, 1.0, 1.0, g,
                                                          tol=5e-5)
    assert checked > 40


def test_sampled_first_tokens_follow_the_target_exactly():
    """The first two emitted tokens of 40,000 rows sampled on the device follow the target's exact
    joint distribution (enumerated on the CPU), as the CPU suite checks."""
    from ..collect import test_engine_lossless as L

    target, draft = _tiny_synthetic()
    joint = L._exact_joint(target, 1.0, 1.0)
    target, draft = target.to(DEVICE), draft.to(DEVICE)
    counts = np.zeros((L.V, L.V))
    for i in range(2):
        g = torch.Generator(device=DEVICE).manual_seed(300 + i)
        log = run_batch(target, draft, [L.PROMPT] * 20_000, SamplingParams(1.0, 1.0, 2, 2), eos_id=None,
                        pad_id=0, generator=g)
        out = np.array(log.outputs)
        np.add.at(counts, (out[:, 0], out[:, 1]), 1)
    assert L._chi2(counts, joint) > 1e-4
    assert L._chi2(counts, L._exact_joint(draft.cpu(), 1.0, 1.0)) < 1e-12  # the test has power


def _tiny_synthetic():
    """The CPU lossless test's pair (vocabulary 6, acceptance ~0.6), built the same way."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    from ..collect import test_engine_lossless as L

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=L.V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn_like(draft.lm_head.weight) * 0.25)
    return target, draft


def test_live_hvd_equals_its_replay_on_the_device(tmp_path):
    from svt.collect import collect
    from svt.config import load_collect_config
    from svt.fit import fit_runs
    from svt.traces.io import open_run

    from ..collect.test_hvd_live import _replayed_cycles

    base = {"target": str(MODELS / "target"), "draft": str(MODELS / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / "structured.jsonl")], "requests": 3, "batch_size": 1,
            "max_new_tokens": 32, "k": 4, "device": DEVICE, "dtype": "float32", "temperature": 0,
            "max_prompt_tokens": 192, "cache": True}
    collect(load_collect_config(None, base=base), tmp_path / "greedy", progress=False)
    fit = fit_runs([tmp_path / "greedy"], "yield-linear", test_fraction=0.0).save(tmp_path / "y.json")
    collect(load_collect_config(None, base={**base, "hvd": {"fit": str(fit), "tau": 1.0}}), tmp_path / "live",
            progress=False)
    g = open_run(tmp_path / "greedy").scan("requests").sort("request").collect()
    h = open_run(tmp_path / "live").scan("requests").sort("request").collect()
    assert g["output_ids"].to_list() == h["output_ids"].to_list()
    live = json.loads((tmp_path / "live" / "run.json").read_text())["hvd"]
    assert live["cycles"] == _replayed_cycles(tmp_path / "greedy", fit, 1.0, 4)


def test_head_trains_on_the_device():
    from sklearn.metrics import roc_auc_score

    from svt.fit.head import HeadConfig, predict_head, train_head

    rng = np.random.default_rng(0)
    n, H = 4000, 16
    h = rng.normal(size=(n, H)).astype(np.float32)
    pos = rng.integers(0, 4, n)
    z = 2.0 * h[:, 3] - 1.5 * h[:, 7]
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.float32)
    model, log = train_head(h[:3000], pos[:3000], y[:3000], np.arange(3000) // 10,
                            HeadConfig(hidden_size=H, k=4), device=DEVICE)
    assert log["device"].startswith(DEVICE.split(":")[0])
    assert roc_auc_score(y[3000:], predict_head(model, h[3000:], pos[3000:])) > roc_auc_score(y[3000:], z[3000:]) - 0.03
