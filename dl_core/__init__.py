"""The bottom of dl-launcher's dependency graph: what node code, the controller's Lambda, the CLIs
and the selector all use, in the standard library (botocore imported lazily where a function needs it).

    aws.py    one way to talk to AWS: the error code, not-found, transient, backoff with full jitter, retry
    argv.py   one-line argparse errors for every CLI
    benchline.py  the dl-bench samples/s line: what a benchmark prints, what bench collect and the node monitor read
    markets.py    the market names (spot, on-demand, capacity-block), spelled once

It imports nothing from the project: the node bundle and the Lambda package ship it whole.
"""
