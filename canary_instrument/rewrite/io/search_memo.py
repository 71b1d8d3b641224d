"""What CI301's caller search found last time, per round, so that a warm run reads again only the files it must.

A round's search looks for a set of wanted entries (`uncovered.callers_wanted`) in the files no rule
needed; whether a file holds a use of them depends only on its bytes. So when an analysed file is
edited (its call graph is built again and the search redone), a round that looks for the same entries
as a round of the last search reuses that round's hits for every file it searched then and that is
unchanged since, and searches only the others: files changed, added, or not searched then (handed to
graph capture at the time). Most edits of a model runner or a scheduler leave the wanted entries as
they were, and such a run then reads no file but the edited ones.

Kept in the cache's `extra` as (files not searched then, files changed since, {entries: hits}): the
hits are the raw matches of the round, before the files earlier rounds found are set aside, so that a
round reused in another order still gives what a full search gives. A run that does not search ages
the memo (its changed files join the second set); a run that searches writes it afresh with the
rounds it ran.
"""

from __future__ import annotations

from canary_instrument.rewrite.io.cache import CheckCache

SEARCHES = "searches"  # cache.extra key


class SearchMemo:
    """The last search's hits per round, valid for the files of `others` that are unchanged since."""

    def __init__(self, cache: CheckCache | None, changed: set[str]) -> None:
        self._cache = cache
        self._changed = changed
        stored = cache.extra.get(SEARCHES) if cache is not None else None
        self._unsearched, self._stale, self._rounds = stored if stored is not None else (frozenset(), frozenset(), {})
        self._ran: dict[frozenset, frozenset[str]] = {}  # this run's rounds
        self._vouched: set[str] | None = None  # the files to search that the last search's hits stand for

    def fresh(self, others: list[str]) -> list[str] | None:
        """The files of `others` (this run's files to search) the last search's hits say nothing of
        (None: there was no last search, or it says nothing of most of them: a search of most files
        gains little from it, and runs on both cores where this one runs on one)."""
        if not self._rounds:
            return None
        outdated = self._changed | self._stale | self._unsearched
        fresh = [key for key in others if key in outdated]
        if 2 * len(fresh) > len(others):
            return None
        self._vouched = set(others).difference(fresh)
        return fresh

    def hits(self, entries: frozenset) -> set[str] | None:
        """The last search's hits for exactly these entries among the files it vouches for (None: it did
        not look for them, or `fresh` was not asked)."""
        found = self._rounds.get(entries)
        return None if found is None or self._vouched is None else self._vouched.intersection(found)

    def record(self, entries: frozenset, hits) -> None:
        self._ran[entries] = frozenset(hits)

    def save(self, unsearched: set[str]) -> None:
        """Keep this run's rounds, searched over every file but `unsearched` (or, where it searched
        nothing, `age` the last search's)."""
        if not self._ran:
            self.age()
        elif self._cache is not None:
            self._cache.set_extra(SEARCHES, (frozenset(unsearched), frozenset(), self._ran))

    def age(self) -> None:
        """Keep the last search's rounds for a run that searched nothing: its changed files are no longer
        vouched for."""
        if self._cache is not None and self._rounds and not self._changed <= self._stale:
            self._cache.set_extra(SEARCHES, (self._unsearched, self._stale | self._changed, self._rounds))
