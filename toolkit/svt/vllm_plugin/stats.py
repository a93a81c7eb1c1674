"""Per-token statistics of the draft and target distributions, reduced where the tensors live.

Only these few numbers per draft token leave the device (never a vocabulary-sized row). They are
the columns of svt's ``drafts`` table; see the trace schema for their meaning.
"""

from __future__ import annotations

import torch

from svt.collect.sampling import q_stats

# the drafter's columns, in this order
Q_COLUMNS = ("q_max", "q_margin", "q_entropy", "q_sampled")
# the target's columns, in this order
P_COLUMNS = ("p_sampled", "p_max", "accept_prob", "accept_prob_expected")


def draft_stats(probs: torch.Tensor, tokens: torch.Tensor | None,
                log_probs: torch.Tensor | None = None) -> torch.Tensor:
    """``[n, 4]`` float32: q_max, q top-1 minus top-2, entropy (nats), q of ``tokens`` (None: the
    argmax, i.e. q_max), for the rows of ``probs`` ``[n, V]`` (a distribution per row);
    ``log_probs``, when the caller has them, spare a logarithm over the vocabulary. Few passes over
    the vocabulary: they are most of the plugin's cost."""
    if probs.dtype != torch.float32:
        probs = probs.float()
    s = q_stats(probs, log_probs)
    q_tok = s["q_max"] if tokens is None else probs.gather(-1, tokens.view(-1, 1).long()).squeeze(-1)
    return torch.stack([s["q_max"], s["q_margin"], s["q_entropy"], q_tok], dim=-1)


def draft_log_probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """The drafter's log-distribution for features when it drafted greedily: log-softmax of its
    logits at the request's temperature, or unscaled (temperature 1) for greedy requests, as svt's
    own collector defines features at temperature 0. ``temperature`` has one entry per request (rows
    are repeated for parallel drafting), or is None when every request is greedy."""
    logits = logits.float()
    if temperature is not None:
        t = temperature.float().view(-1, 1)
        if t.shape[0] != logits.shape[0]:  # parallel drafting: K rows per request
            t = t.repeat_interleave(logits.shape[0] // t.shape[0], dim=0)
        logits = logits / torch.where(t < 1e-5, torch.ones_like(t), t)
    return logits.log_softmax(dim=-1)


def draft_probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """:func:`draft_log_probs_from_logits`, exponentiated."""
    return draft_log_probs_from_logits(logits, temperature).exp()


def target_stats(target_logits: torch.Tensor, tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                 greedy: torch.Tensor | None) -> torch.Tensor:
    """``[n, 4]`` float32: p of ``tokens``, p_max, the exact acceptance probability of the drafted
    token and 1 - TV(p, q), for draft tokens whose processed target logits are ``target_logits``.

    ``greedy`` marks rows of greedy requests (None: all rows are): there acceptance is argmax
    agreement, so both probabilities are that 0/1 outcome. Otherwise, with the drafter's
    distribution ``draft_probs`` the token is accepted with probability min(1, p/q) and
    sum min(p, q) is the acceptance probability before it is drawn; without it the drafter
    proposed its argmax (a point mass), accepted with probability p(token) both ways.
    """
    logits = target_logits.float()
    tok = tokens.long().view(-1, 1)
    top, arg = logits.max(dim=-1)  # one pass: p_max and the argmax
    lse = logits.logsumexp(dim=-1)
    p_tok = (logits.gather(-1, tok).squeeze(-1) - lse).exp()
    p_max = (top - lse).exp()
    if draft_probs is not None:
        p = (logits - lse.unsqueeze(-1)).exp()
        q = draft_probs.float()
        q_tok = q.gather(-1, tok).squeeze(-1)
        # vLLM's kernel accepts only where draft_prob > 0 (a token q gave no mass is rejected)
        accept = torch.where(q_tok > 0, (p_tok / q_tok.clamp_min(1e-30)).clamp(max=1.0), torch.zeros_like(p_tok))
        expected = torch.minimum(p, q).sum(-1).clamp(0.0, 1.0)
    else:
        accept = p_tok
        expected = p_tok
    agree = (arg == tokens.long()).float()
    if greedy is None:
        accept = expected = agree
    else:
        accept = torch.where(greedy, agree, accept)
        expected = torch.where(greedy, agree, expected)
    return torch.stack([p_tok, p_max, accept, expected], dim=-1)
