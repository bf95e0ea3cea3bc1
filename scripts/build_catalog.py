"""Rebuild the embedded catalog offline: dl_selector/data/catalog.json (specs) and
dl_selector/data/prices/<region>.json (dl_selector/embedded.py).

Runs the real `catalog refresh` code against moto, whose bundled DescribeInstanceTypes and
DescribeInstanceTypeOfferings data is AWS's own, with live prices off (moto's spot history is a
placeholder): prices come from the cited dl_selector/data/prices.csv. With AWS credentials, use
`python -m dl_selector catalog refresh --out FILE` instead for live data.
"""
from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if __name__ == "__main__":  # --help describes the rebuild and writes nothing (issue 26)
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

for k, v in {"AWS_ACCESS_KEY_ID": "offline", "AWS_SECRET_ACCESS_KEY": "offline",
             "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ[k] = v
os.environ.pop("AWS_ENDPOINT_URL", None)

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from dl_selector import embedded  # noqa: E402
from dl_selector.refresh import refresh  # noqa: E402

with mock_aws():
    catalog = refresh(
        live_prices=False,
        session=boto3.session.Session(region_name="us-east-1"),
        specs_source=f"EC2 DescribeInstanceTypes/DescribeInstanceTypeOfferings records as bundled in moto {version('moto')}",
    )
embedded.write(catalog.to_dict())
print(f"{len(catalog)} types, {len(catalog.regions)} regions -> dl_selector/data/catalog.json and prices/<region>.json")
