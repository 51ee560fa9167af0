"""The demo clock (../2026-11-29-host-clock-5/demo_clock.py) with one more bench variant,
self-draft:dgrid: the default settings on the grid (grid=True), for the default before the
change (GRID_FROM). Arguments as demo_clock.py's."""
import sys, runpy
from specctl.runtime.jobs import config
config.VARIANTS["self-draft"]["dgrid"] = {"grid": True}
sys.argv = ["demo_clock.py"] + sys.argv[1:]
runpy.run_path("bench-results/2026-11-29-host-clock-5/demo_clock.py", run_name="__main__")
