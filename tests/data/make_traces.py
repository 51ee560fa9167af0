"""Turn a `specctl generate` output (records with accept_lengths) into selfdraft-traces.json.

    python tests/data/make_traces.py OUT.jsonl > tests/data/selfdraft-traces.json

Each answer becomes a string with a character per output position: "-" for its first token
(the prefill's), then for each verify step "1" per accepted draft, and for the step's bonus
token "0" where the drafter had drafted for that position and was wrong, "-" where it had
drafted nothing there (no candidate: every draft of the step accepted, or none drafted); cut
to the answer's length. tests/data/README.md says how the output was made.
"""
import json
import sys

known = []
for line in open(sys.argv[1], encoding="utf-8"):
    if not line.strip():
        continue
    r = json.loads(line)
    bits = "-" + "".join("1" * a + ("0" if d > a else "-")
                         for a, d in zip(r["accept_lengths"], r["draft_lengths"]))
    known.append(bits[:r["new_tokens"]])
print(json.dumps({"source": "tests/data/README.md", "known": known}, indent=0))
