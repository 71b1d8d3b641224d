"""The free mailbox's host side (runtime/free_mail.py) and the allocator note that posts to it.

A free noted between sites, after init, of slots of their own posts them by address for the next pass;
anything else is copied into the freed-slot buffer as before. Rows are reused only once their pass has
published; a row that is full or still waiting sends the free to the copy.
"""

import torch

from canary_instrument.runtime.free_mail import PAIRS, ROWS, WORDS, FreeMail, make_mailbox
from canary_instrument.runtime.request_side import RequestSide
from canary_instrument.runtime.status import PublishedWords
from canary_instrument.runtime.steps import StepState

from .test_perturb_kinds import scenario


def posted(box, tag):
    """The (address, count) pairs of row ``tag % ROWS`` when it holds ``tag``."""
    row = box[tag % ROWS].tolist()
    if row[0] != tag:
        return []
    return [(row[2 + 2 * k], row[3 + 2 * k]) for k in range(row[1])]


def test_posts_fill_the_row_of_their_pass_then_refuse():
    box = make_mailbox("cpu")
    assert box.shape == (ROWS, WORDS)
    mail = FreeMail(box)
    frees = [torch.arange(3) + 10 * i for i in range(PAIRS + 1)]
    for slots in frees[:PAIRS]:
        assert mail.post(5, slots, published=4)
    assert posted(box, 5) == [(t.data_ptr(), 3) for t in frees[:PAIRS]]
    assert not mail.post(5, frees[PAIRS], published=4)  # the row is full: the caller copies


def test_a_row_is_reused_only_once_its_pass_has_published():
    box = make_mailbox("cpu")
    mail = FreeMail(box)
    first, second = torch.arange(4), torch.arange(2)
    assert mail.post(7, first, published=6)
    assert not mail.post(7 + ROWS, second, published=6)  # pass 7 still to read it
    assert posted(box, 7) == [(first.data_ptr(), 4)]
    assert mail.post(7 + ROWS, second, published=7)
    assert posted(box, 7 + ROWS) == [(second.data_ptr(), 2)]  # the old pairs are gone with the old tag


def test_posted_tensors_are_kept_until_their_pass_published_and_can_be_taken_back():
    box = make_mailbox("cpu")
    mail = FreeMail(box)
    slots = torch.arange(5)
    assert mail.post(3, slots, published=2)
    assert mail.post(4, torch.arange(2), published=2)
    taken = mail.take(4)
    assert [t.tolist() for t in taken] == [[0, 1]] and posted(box, 4) == []
    assert mail.take(4) == []
    assert mail.post(5, torch.arange(1), published=3)  # pass 3 has published: its tensor is let go
    assert all(t is not slots for _, t in mail._kept)


def _side_with_mail(sc):
    state = sc.state
    state.freed = torch.zeros(16, dtype=torch.int64)
    steps = StepState(PublishedWords(torch.zeros(64, dtype=torch.int64)))
    steps.init_finished = True
    steps.planned = 9
    side = RequestSide(state)
    box = make_mailbox("cpu")
    side.attach_mail(FreeMail(box), steps, -1)
    return side, steps, box


def test_a_free_between_sites_is_posted_for_the_next_pass_not_copied():
    side, steps, box = _side_with_mail(scenario("mha", decode=True, v_half=True, seed=0))
    slots = torch.tensor([4, 5, 6])
    side.on_free(slots)
    assert posted(box, 10) == [(slots.data_ptr(), 3)]
    assert side.state.freed.count_nonzero() == 0 and side.offset == 0
    assert [t.tolist() for t in side.take_posted()] == [[4, 5, 6]]


def test_frees_that_do_not_qualify_are_copied():
    """A view of another tensor (the engine may write its base again), int32 slots, a free inside an open
    site (its pass is launched already) and one before init: copied into the buffer."""
    side, steps, box = _side_with_mail(scenario("mha", decode=True, v_half=True, seed=0))
    base = torch.arange(20, 30)
    side.on_free(base[2:4])
    side.on_free(torch.tensor([7], dtype=torch.int32))
    steps.open = object()
    side.on_free(torch.tensor([8]))
    steps.open, steps.init_finished = None, False
    side.on_free(torch.tensor([9]))
    assert side.state.freed[:5].tolist() == [22, 23, 7, 8, 9]
    assert posted(box, 10) == []
