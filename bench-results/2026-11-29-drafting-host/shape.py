# Self-Draft's draft shapes on the demo model (real prompts, fp32, CPU, --speculate fixed so every step
# drafts): per sequence-step the candidates found, the trie's nodes, the rows chains of the same candidates
# take, and what a fixed C x G layout would verify; per drafting sequence-step the draft nodes, the
# tokens accepted, the probe rows. Checks the outputs equal ar's.
#   python bench-results/2026-11-29-drafting-host/shape.py light|default BATCH N MAXTOK
import sys, json, statistics, collections
from specctl import Generator
from specctl.speculative import self_draft as SD
from specctl.speculative.trie import build_trie
variant, batch, n, maxtok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rec = []
orig_c = SD.SelfDraftDrafter.candidates
def cands(self, seq):
    out = orig_c(self, seq)
    c, nj, nc = out
    rec.append({"c": len(c), "ctx": nc, "lens": [len(x) for x in c], "trie": len(build_trie(c, 1 << 20))})
    return out
SD.SelfDraftDrafter.candidates = cands
acc = []
orig_o = SD.SelfDraftDrafter.observe
def obs(self, seqs, proposals, verdicts, probe_out):
    for p, v in zip(proposals, verdicts):
        if p is not SD.IDLE and len(p.draft):
            acc.append((len(p.draft), len(v.accepted), len(p.probe)))
    return orig_o(self, seqs, proposals, verdicts, probe_out)
SD.SelfDraftDrafter.observe = obs
prompts = [json.loads(l)["turns"][0] for l in open("recipes/prompts/mtbench16.jsonl")][:n]
method = "self-draft"
opts = {"light": dict(prompt_grams=True, branches=0, context_cands=4, corpus_cands=1)}.get(variant, {})
g = Generator(model="smollm2-135m-instruct", method=method, batch_size=batch, speculate="fixed", dtype="fp32", device="cpu", **opts)
outs = g.generate(prompts, max_tokens=maxtok)
ref = Generator(model="smollm2-135m-instruct", method="ar", batch_size=batch, dtype="fp32", device="cpu").generate(prompts, max_tokens=maxtok)
print("lossless:", [o.token_ids for o in outs] == [o.token_ids for o in ref])
P = g.config().method
C = max(r["c"] for r in rec); G = max(max(r["lens"], default=0) for r in rec)
print(f"{method} {variant}: {len(rec)} sequence-steps with candidates looked up; most candidates {C}, longest {G}")
print("candidates a sequence-step: median", statistics.median(r["c"] for r in rec), "mean", round(statistics.mean(r["c"] for r in rec), 2),
      "none:", sum(r["c"] == 0 for r in rec))
print("trie nodes: median", statistics.median(r["trie"] for r in rec), "mean", round(statistics.mean(r["trie"] for r in rec), 2))
print("chain rows (found x G):", round(statistics.mean(r["c"] * G for r in rec), 2), " fixed C x G:", C * G)
print("drafting sequence-steps", len(acc), "draft nodes mean", round(statistics.mean(a[0] for a in acc), 2),
      "accepted mean", round(statistics.mean(a[1] for a in acc), 3), "probe rows mean", round(statistics.mean(a[2] for a in acc), 2))
h = collections.Counter(a[1] for a in acc); print("accepted hist", sorted(h.items()))
