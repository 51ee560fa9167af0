# runs a probe with the job account charging nothing for slots held for a grouped admission
# (Accounting._held): python noheld.py PROBE.py ARGS
import runpy, sys
from specctl.runtime.step.accounting import Accounting
Accounting._held = lambda self, n, h: 0.0
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
