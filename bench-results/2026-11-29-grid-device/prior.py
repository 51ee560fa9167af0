"""demo_clock.py with the controller's prior acceptance set to P (an experiment: not kept).

    python bench-results/2026-11-29-grid-device/prior.py P BATCH PROMPTS THREADS ROUNDS METHOD
"""
import sys, runpy
import specctl.runtime.control.controller as C
P = float(sys.argv.pop(1))
init = C.Controller.__init__
def __init__(self, *a, **kw):
    kw.setdefault('prior_accept', P)
    init(self, *a, **kw)
C.Controller.__init__ = __init__
sys.argv = ['demo_clock.py'] + sys.argv[1:]
runpy.run_path('bench-results/2026-11-29-host-clock-5/demo_clock.py', run_name='__main__')
