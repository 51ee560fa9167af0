"""`specctl build-cache`: the corpus n-gram cache Self-Draft drafts from (command.py), its
corpus readers (corpus.py: files, zips, OANC, stats) and its counting (ngrams.py)."""
