"""Measured selection: plan a benchmark of the selector's candidates, run it on real instances,
collect the results and rank by measured samples per dollar (`python -m dl_selector bench ...`).

Everything the node runs (contract, runner, reference) is standard library plus boto3/torch, so
the benchmark stack can ship this package as it is.
"""

# The files `bench plan` writes and `bench collect` reads by default. Here, not in contract.py, so
# that the CLI's parser (built on every `python -m dl_selector` start) needs no more than this file.
DEFAULT_PLAN_FILE = "bench-plan.json"
DEFAULT_RESULTS_FILE = "bench-results.json"
