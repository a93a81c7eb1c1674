"""A run decoding from rows already prefilled (``run_batch(start=...)``, what a cost profile does to
time several K on one prefill) is the run that prefills them itself, and a copy decoded leaves the
prefill it was copied from as it was."""

import numpy as np
import pytest
import torch

from svt.collect.engine import SamplingParams, prefill_rows, run_batch
from tests.collect.test_engine import PROMPTS, _ids


def _run(pair, prompts, k, start=None):
    return run_batch(pair.target, pair.draft, prompts, SamplingParams(1.0, 1.0, k, 12), eos_id=None,
                     pad_id=pair.tokenizer.pad_token_id, generator=torch.Generator().manual_seed(3), start=start)


@pytest.mark.parametrize("drafter", ["draft-small", "eagle3"])
def test_decoding_from_copies_of_one_prefill_is_decoding_from_scratch(tiny_pair, models_dir, drafter):
    from svt.models import load_pair

    pair = tiny_pair if drafter == "draft-small" else load_pair(models_dir / "target", models_dir / drafter,
                                                                 device="cpu", dtype="float32")
    prompts = _ids(tiny_pair.tokenizer, PROMPTS)
    with torch.inference_mode():
        shared = prefill_rows(pair.target, pair.draft, prompts, tiny_pair.tokenizer.pad_token_id, torch.device("cpu"))
    for k in (0, 3, 3):  # the second k = 3 decodes a copy taken after two runs from the same prefill
        fresh, copied = _run(pair, prompts, k), _run(pair, prompts, k, shared.clone(use_draft=k > 0))
        assert copied.outputs == fresh.outputs
        for col in ("accepted", "emitted"):
            np.testing.assert_array_equal(np.concatenate(copied.steps[col]), np.concatenate(fresh.steps[col]))
        if k:
            np.testing.assert_allclose(np.concatenate(copied.drafts["q_max"]), np.concatenate(fresh.drafts["q_max"]))


def test_a_start_must_hold_every_prompt_of_one_static_batch(tiny_pair):
    prompts = _ids(tiny_pair.tokenizer, PROMPTS)
    with torch.inference_mode():
        shared = prefill_rows(tiny_pair.target, tiny_pair.draft, prompts[:2], tiny_pair.tokenizer.pad_token_id,
                              torch.device("cpu"))
    with pytest.raises(ValueError, match="all 3 prompts"):
        _run(tiny_pair, prompts[:3], 2, shared.clone())
