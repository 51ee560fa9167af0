import sys
sys.path.insert(0, "tests")
import test_host_clock as T
from sim import script_model
m, patch = script_model()
b = int(sys.argv[1]); n = 4 * b
for r in range(3):
    ratios, stats, ar = T.host_charged_ratios(m, b, n, patch, rounds=1, methods=["self-draft"])
    st = stats["self-draft"]
    bh = st.budget_hist; tot = sum(v for k, v in bh.items() if k)
    mb = sum(k * v for k, v in bh.items() if k) / max(1, tot)
    print(round(ratios["self-draft"], 3), "steps", st.steps, "drafting", st.controlled_steps - st.lean_steps, "seq-steps", tot, "mean budget", round(mb, 1), "tokens", st.verified_tokens, "pred", round(st.predicted_tokens), "probe_tokens", st.probe_tokens, "step_tokens", st.step_tokens, "meas ms", round(st.measured_step_ms), "pred ms", round(st.predicted_step_ms), flush=True)
