"""The GPU runbook (recipes/gpu/runbook.py is its entry point and says what it does).

Standard library only at import time: `run` starts on the device's bare python3 before any
wheel is installed. What needs specctl, torch or transformers is in inputs.py, run as
`$PY runbook.py HELPER` in a process of its own, so it gets the interpreter and PYTHONPATH the
steps get.

- settings.py: the environment variables, read once; what every command started gets
- plan.py: the steps of each call, their budgets and estimates, the caps
- proc.py: commands under a time limit (the whole process group killed), shell quoting
- carry.py: sizes (a call carries at most 64 MiB), git's exclude list, file helpers
- stage.py: `stage`, on the CPU machine: the carries and the two device calls
- inputs.py: the helpers that import specctl or torch (ShareGPT cut, env facts, ...)
- steps.py: what each step runs, in the process `run` watches
- run.py: `run`: one call's steps, each under its budget, none stopping the next
- collect.py: `collect`: the calls' tarballs into one results folder
- readme.py: a results folder's README.md
- rehearse.py: `rehearse`: stage, both parts and collect on the CPU with a tiny model
"""
