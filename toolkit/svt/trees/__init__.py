"""Draft trees: growing a tree of draft tokens (static shapes, EAGLE-2 growth by path probability)
and verifying it against the target, greedily or by lossless multi-candidate speculative sampling.

`svt.trees.grow` builds trees from any drafter given as a function from token paths to draft
distributions; `svt.trees.verify` labels every node (accepted, verified and rejected, not reached)
and emits the same tokens decoding from the target would (in distribution, exactly).
"""

from svt.trees.grow import DraftTree, grow_dynamic, grow_static
from svt.trees.verify import TreeOutcome, verify_greedy, verify_sampling

__all__ = ["DraftTree", "TreeOutcome", "grow_dynamic", "grow_static", "verify_greedy", "verify_sampling"]
