"""The kv_canary_perturb= line (format, parse, find_all) and the scorer that matches it against violations."""

import pytest

from canary_instrument.runtime.perturb import Injection, score, score_log
from canary_instrument.runtime.reports.violations import Violation


def inj(kind, step=5, slot=40, position=3, req=2, group="-", half="-", applied=True, **extra):
    return Injection(step=step, kind=kind, slot=slot, position=position, req=req, group=group, half=half,
                     applied=applied, extra=tuple(extra.items()))


def vio(step=5, slot=40, position=3, req=2, reasons=("fingerprint",), group="full", half="k", kernel="pre_forward"):
    return Violation(kernel=kernel, group=group, half=half, slot=slot, position=position, stored=1, expected=2,
                     reasons=frozenset(reasons), req_pool_index=req, step=step)


def test_line_round_trip_and_find_all():
    one = inj("real_kv_used", group="swa", half="v", byte=5, bit=7)
    two = inj("req_to_token", slot=-1, applied=False, new_position=9, new_slot=77)
    assert one.format() == ("kv_canary_perturb= step=5 kind=real_kv_used group=swa half=v slot=40 position=3 req=2 "
                            "applied=1 byte=5 bit=7")
    log = f"INFO x: warm\nWARNING canary_instrument.runtime: {one.format()}\nnoise\n{two.format()}\n"
    assert Injection.find_all(log) == [one, two]
    assert Injection.parse("kv_canary violation: nothing") is None
    assert two.get("new_slot") == 77 and two.get("absent", -9) == -9
    with pytest.raises(ValueError, match="malformed kv_canary_perturb= line"):
        Injection.parse("kv_canary_perturb= step=1 kind=x")


def test_each_kind_is_matched_by_what_the_canary_reports_for_it():
    remap = inj("req_to_token", position=3, req=2, new_position=6)
    flip = inj("real_kv_post_forward", step=7, slot=90, group="full", half="v")
    swap = inj("next_token_swap", slot=11, position=4, req=1, other_req=3, other_position=8, other_slot=12)
    lost = inj("real_kv_unused_cache", step=9, slot=123, req=-1, group="swa", half="k")
    violations = [
        vio(step=5, position=4, req=2, reasons=("link",), slot=1),  # remap: the next position's link
        vio(step=8, slot=90, group="full", half="v", position=0, req=-1, kernel="sweep"),  # flip, one step later
        vio(step=6, slot=90, group="full", half="v", req=7),  # before the flip: not it
        vio(step=7, slot=90, group="full", half="k", req=7),  # the other half: not it
        vio(step=5, position=8, req=3, reasons=("token",), slot=12, kernel="post_forward"),  # swap, other row
        vio(step=20, slot=11, group="full", position=4, req=6, reasons=("token",)),  # swap's slot, reused later
        vio(step=9, slot=123, group="full", half="k", req=7),  # another group's slot 123: not the lost one
    ]
    result = score([remap, flip, swap, lost, inj("real_kv_used", applied=False)], violations)
    kinds = result.kinds
    assert (kinds["req_to_token"].reported, kinds["req_to_token"].delays) == (1, [0])
    assert (kinds["real_kv_post_forward"].reported, kinds["real_kv_post_forward"].delays) == (1, [1])
    assert (kinds["next_token_swap"].reported, kinds["next_token_swap"].delays) == (1, [0])
    assert kinds["real_kv_unused_cache"].missed == [lost]
    assert (result.injected, result.reported, result.not_applied, result.violations) == (4, 3, 1, 7)
    assert result.unattributed == [violations[2], violations[3], violations[6]]
    text = result.format()
    assert "real_kv_unused_cache" in text and "unattributed 3" in text
    assert result.to_dict()["kinds"]["real_kv_post_forward"]["delay_median"] == 1


def test_a_swap_reported_by_the_token_oracle_is_attributed_to_it():
    swap = inj("next_token_swap", slot=11, position=4, req=1, other_req=3, other_position=8, other_slot=12)
    seen = vio(step=5, position=4, req=1, reasons=("oracle",), slot=11, kernel="token_oracle")
    result = score([swap], [seen])
    assert result.kinds["next_token_swap"].reported == 1 and result.unattributed == []


def test_score_log_reads_both_line_kinds():
    flip = inj("real_kv_used", group="full", half="k")
    log = "\n".join([flip.format(), vio().format(), vio(step=6, slot=41).format()])
    result = score_log(log)
    assert (result.injected, result.reported, len(result.unattributed)) == (1, 1, 1)


def test_a_flipped_row_bit_read_by_an_eagle_draft_is_attributed_to_it():
    """The draft compares its token with the target's token word, where row_high_bit flipped a high bit."""
    flipped = inj("row_high_bit", step=5, slot=7, position=6, req=1, group="full", half="k", bit=40)
    by_draft = [vio(step=9, slot=7, position=6, req=r, reasons=("token",), half=h) for r in (1, 12) for h in "kv"]
    elsewhere = vio(step=9, slot=8, position=6, req=1, reasons=("token",))
    result = score([flipped], [*by_draft, elsewhere])
    assert result.kinds["row_high_bit"].reported == 1
    assert result.unattributed == [elsewhere]


def test_each_tensor_parallel_rank_is_scored_on_its_own_lines():
    # Ranks share slot numbers but each guards its own shard of the heads: rank 1's report is not rank 0's.
    flip = "kv_canary_perturb= step=55 kind=real_kv_used group=full half=v slot={slot} position=140 req=19 applied=1 byte=14 bit=3 layer=3"
    report = ("kv_canary violation: kernel=pre_forward group=full half=v reason=fingerprint slot={slot} position=140 "
              "stored=1 expected=2 req=19 step=55")
    log = "\n".join([
        "[2026-11-29 00:35:55 TP0] " + flip.format(slot=2054),
        "[2026-11-29 00:35:55 TP1] " + flip.format(slot=77),
        "[2026-11-29 00:35:55 TP1] " + report.format(slot=2054),
        "[2026-11-29 00:35:55 TP0] " + report.format(slot=2054),
    ])
    result = score_log(log)
    assert (result.injected, result.reported, result.violations) == (2, 1, 2)
    assert [m.slot for m in result.kinds["real_kv_used"].missed] == [77]
    assert [v.slot for v in result.unattributed] == [2054]  # rank 1's report, which no rank 1 injection explains
    # One process (no rank in the prefix): the same lines are one run.
    assert score_log(log.replace(" TP0]", "]").replace(" TP1]", "]")).unattributed == []


def test_an_swa_draft_s_comparisons_are_attributed_at_its_own_row():
    """A draft on an SWA pool (a multi-layer EAGLE MTP layer) compares its SWA rows with the target's FULL/K row of
    the next position too, and reports those at its own row: the position before the one corrupted."""
    swap = inj("next_token_swap", slot=11, position=4, req=1, other_req=3, other_position=8, other_slot=12,
               swa_slot=5, other_swa_slot=6)
    flipped = inj("row_high_bit", step=5, slot=7, position=6, req=2, group="full", half="k", bit=40)
    draft_swa = [vio(step=5, slot=30 + p, position=p, req=r, reasons=("token",), group="swa", half=h)
                 for r, p in ((1, 3), (3, 7), (2, 5)) for h in "kv"]
    not_it = [vio(step=5, slot=40, position=4, req=1, reasons=("token",), group="swa"),  # at the position itself
              vio(step=5, slot=41, position=3, req=1, reasons=("token", "link"), group="swa"),  # not a comparison
              vio(step=5, slot=42, position=5, req=2, reasons=("token",), group="swa", kernel="post_forward")]
    result = score([swap, flipped], [*draft_swa, *not_it])
    assert result.kinds["next_token_swap"].reported == 1 and result.kinds["row_high_bit"].reported == 1
    assert result.unattributed == not_it[1:]  # the first is at a swapped (request, position): the swap's
    v_flip = inj("row_high_bit", step=5, slot=7, position=6, req=2, group="full", half="v", bit=40)
    assert score([v_flip], draft_swa[4:]).kinds["row_high_bit"].reported == 0  # the draft reads FULL/K only
