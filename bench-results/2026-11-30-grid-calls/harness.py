"""What parts.py, learn.py and nolearn.py share: recipes/host_profile.py's arguments (the tiny
model at /tmp/tiny, b64, 128 prompts x 48 tokens, CUDA's schedule, the graph path's eager
stand-in, 3 repeats) and a perf_counter timer put around a function."""
import sys
import time
from collections import defaultdict

T = defaultdict(list)   # name -> wall us of each call


def profile_argv(methods: str, *extra: str) -> None:
    """host_profile's command line for `methods`, then extra (and this script's own)."""
    sys.argv = ["host_profile.py", "--model", "/tmp/tiny",
                "--input", "recipes/prompts/specbench128.jsonl", "--store", "/tmp/tiny-store",
                "--batch-sizes", "64", "--threads", "1", "--max-tokens", "48", "--prompts", "128",
                "--methods", methods, "--schedule", "cuda", "--repeats", "3",
                "--skip-set", "/tmp/tiny/skip.json", "--graphs", *extra, *sys.argv[1:]]
    sys.path.insert(0, "recipes")


def wrap(obj, name: str, key) -> None:
    """obj.name timed into T[key], or T[key(args, result)] where key is a function."""
    f = getattr(obj, name)

    def timed(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        T[key(a, out) if callable(key) else key].append((time.perf_counter() - t) * 1e6)
        return out
    setattr(obj, name, timed)
