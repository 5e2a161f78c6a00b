"""Token-balanced splits (rlctl.runtime.balance) on hand-computed cases, without Ray."""

import numpy as np

from rlctl.runtime import Batch, Dispatch
from rlctl.runtime.balance import BALANCE, balance_rows, balanced, restore_order, token_balanced_order
from rlctl.runtime.dispatch import collect_results, split_arguments

TOKENS = np.array([10, 1, 1, 10, 5, 5, 1, 1])


def _mask(tokens) -> np.ndarray:
    return (np.arange(tokens.max())[None, :] < tokens[:, None]).astype(np.int64)


def test_rows_go_longest_first_to_the_least_loaded_rank():
    order = token_balanced_order(TOKENS, 2)
    # 10 -> r0, 10 -> r1, 5 -> r0, 5 -> r1, then the 1s alternate: 17 tokens each (consecutive halves: 22 | 12)
    assert order.tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
    assert [TOKENS[order[:4]].sum(), TOKENS[order[4:]].sum()] == [17, 17]


def test_a_prompts_samples_stay_on_one_rank():
    uid = np.array(list("aabbccdd"), dtype=object)
    order = token_balanced_order(TOKENS, 2, groups=uid)
    # units a=11, b=11, c=10, d=2: a -> r0, b -> r1, c -> r0 (tie: the first), d -> r1; 21 | 13 is the best pairing
    assert order.tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    odd = token_balanced_order(TOKENS[:6], 2, groups=uid[:6])   # 3 rows per rank: pairs cannot fit, rows placed
    assert sorted(odd.tolist()) == list(range(6)) and TOKENS[odd[:3]].sum() == TOKENS[odd[3:]].sum() == 16


def test_mini_batches_keep_their_rows():
    order = token_balanced_order(TOKENS, 2, blocks=2)
    assert sorted(order[:4].tolist()) == [0, 1, 2, 3] and sorted(order[4:].tolist()) == [4, 5, 6, 7]
    assert order.tolist() == [0, 1, 2, 3, 4, 6, 5, 7]   # per block, ranks in row order: [10,1 | 1,10] [5,1 | 5,1]


def test_a_dp_call_sees_balanced_parts_and_returns_rows_in_input_order():
    batch = Batch({"attention_mask": _mask(TOKENS), "row": np.arange(8)}, {"step": 3})
    args, kwargs, inverse = balance_rows(Dispatch.DP, 2, (balanced(batch, 64),), {})
    parts = split_arguments(Dispatch.DP, 2, args, kwargs, "actor.compute_log_prob")
    assert [p[0][0]["row"].tolist() for p in parts] == [[0, 1, 4, 6], [2, 3, 5, 7]]
    assert all(p[0][0].meta == {"step": 3} for p in parts)          # the flag stops at the group
    joined = restore_order(collect_results(Dispatch.DP, [p[0][0] for p in parts]), inverse)
    assert joined["row"].tolist() == list(range(8))


def test_unflagged_or_unsplittable_batches_pass_as_they_are():
    batch = Batch({"attention_mask": _mask(TOKENS)})
    assert balance_rows(Dispatch.DP, 2, (batch,), {})[2] is None
    assert balanced(batch, 0) is batch
    assert BALANCE not in balanced(balanced(batch, 8), 0).meta          # a role without a budget drops the flag
    args, _, inverse = balance_rows(Dispatch.DP_TRAIN, 3, (balanced(batch, 8),), {})   # 8 rows over 3: refused later
    assert inverse is None and BALANCE not in args[0].meta and args[0]["attention_mask"] is batch["attention_mask"]
