"""`specctl train-adapter`: Kangaroo's adapter trained on ShareGPT conversations (command.py,
train.py), its exit layer and eta chosen by cost (cost.py, sweep.py, fit.py, features.py, eta.py)."""
