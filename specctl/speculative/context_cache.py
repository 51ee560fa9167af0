"""Self-Draft's context cache (papers/000): the run's n-grams, key token -> its newest
continuations of G tokens, shared by every sequence of a run and kept across prompts."""

from __future__ import annotations

from itertools import islice


class ContextCache:
    """key token -> LRU queue of continuations (tuples of G tokens), newest last: a dict of
    continuations kept in insertion order (a plain dict's delete and insert cost ~30% less a
    gram than an OrderedDict's move_to_end and popitem)."""

    def __init__(self, lru: int, gram: int = 4):
        self.lru, self.gram = lru, gram
        self.grams: dict[int, dict] = {}
        # keys added to since the last trim, and its keep (a key untouched since then holds
        # at most that many: the next trim to as many or more need not visit it; a full scan
        # grows with the keys the run has seen, every second finished prompt)
        self.touched: set[int] = set()
        self.kept: int | None = None

    def push(self, key: int, cont: tuple[int, ...]) -> None:
        self.push_many([(key, cont)])

    def push_many(self, grams) -> None:
        """push(key, cont) of each (key, cont) in order, in one call (a step's grams)."""
        table, lru, touched = self.grams, self.lru, self.touched
        for key, cont in grams:
            q = table.get(key)
            if q is None:
                table[key] = {cont: None}
                touched.add(key)
            elif q.pop(cont, 0) is None:   # it was there: now the newest
                q[cont] = None
            else:
                q[cont] = None
                touched.add(key)
                if len(q) > lru:
                    del q[next(iter(q))]

    def push_texts(self, texts: list[list[int]]) -> None:
        """The grams of each text (every window of G + 1 tokens: its first the key), the texts
        in order (ContextTable's call too)."""
        g = self.gram
        for ids in texts:
            self.push_many((ids[j], tuple(ids[j + 1:j + g + 1])) for j in range(len(ids) - g))

    def get(self, key: int, limit: int) -> list[tuple[int, ...]]:
        q = self.grams.get(key)
        if not q or limit <= 0:
            return []
        return list(islice(reversed(q), limit))

    def trim(self, keep: int) -> None:
        """Every key keeps only its `keep` newest continuations."""
        visit = self.touched if self.kept is not None and keep >= self.kept else list(self.grams)
        for key in visit:
            q = self.grams.get(key)
            if q is None:
                continue
            while len(q) > keep:
                del q[next(iter(q))]
            if not q:
                del self.grams[key]
        self.touched, self.kept = set(), keep

    def __len__(self) -> int:
        return sum(len(q) for q in self.grams.values())
