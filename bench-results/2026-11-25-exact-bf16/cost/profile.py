import cProfile, pstats, sys, json
from specctl import Generator
prompts = [json.loads(l)["prompt"] for l in open("recipes/prompts/specbench128.jsonl")][:8]
for exact in (False, True):
    g = Generator("/work/bench-store/models/smollm2-135m-instruct", "ar", store="/tmp/prof-store", device="cpu", dtype="bf16", max_tokens=48, batch_size=8, exact=exact, threads=2)
    g.generate(prompts[:2], max_tokens=2)
    cProfile.run("g.generate(prompts)", f"/tmp/p3-{exact}.prof")
    st = pstats.Stats(f"/tmp/p3-{exact}.prof"); print("exact", exact, "total", round(st.total_tt, 2))
    st.sort_stats("tottime").print_stats(8)
