"""Token-structure features: the shares of a text's characters that are punctuation, digits,
spaces, newlines or brackets, per token id of a tokenizer (cache drafts and their contexts use them)."""

from __future__ import annotations

import string

import numpy as np

# token-structure classes of characters, in this order (shares of a text's characters)
CHAR_CLASSES = ("punct", "digit", "space", "newline", "bracket")
_BRACKETS = set("()[]{}<>")
_PUNCT = set(string.punctuation) - _BRACKETS


def char_class_table(tokenizer, vocab_size: int) -> np.ndarray:
    """Per token id: counts of characters in each of ``CHAR_CLASSES`` and the total, ``[V, 6]``."""
    table = np.zeros((vocab_size, len(CHAR_CLASSES) + 1), dtype=np.float32)
    for tid in range(vocab_size):
        text = tokenizer.decode([tid])
        table[tid] = (sum(c in _PUNCT for c in text), sum(c.isdigit() for c in text),
                      sum(c in " \t" for c in text), text.count("\n"), sum(c in _BRACKETS for c in text),
                      len(text))
    return table


def char_class_shares(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Shares of the characters of tokens ``ids`` in each of ``CHAR_CLASSES`` (zeros for none)."""
    if ids.size == 0:
        return np.zeros(len(CHAR_CLASSES), dtype=np.float32)
    counts = table[ids].sum(0)
    return counts[:-1] / max(counts[-1], 1.0)
