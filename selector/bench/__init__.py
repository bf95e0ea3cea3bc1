"""Measured selection: plan a benchmark of the selector's candidates, run it on real instances,
collect the results and rank by measured samples per dollar (`python -m selector bench ...`).

Everything the node runs (contract, runner, reference) is standard library plus boto3/torch, so
the benchmark stack can ship this package as it is.
"""
