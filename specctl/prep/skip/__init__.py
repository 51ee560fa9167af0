"""`specctl search-skip`: Bayesian optimisation of draft-verify's skip layers (command.py,
search.py over bit_gp.py's model), each candidate scored by evaluate.py (tf_probe.py: its
teacher-forced probe)."""
