#!/usr/bin/env python3
"""The CDK app: context -> validated settings -> stacks. `cdk deploy -c profile=NAME`."""
from __future__ import annotations

import os
import sys

# The project's baseline is Node 20 (what CI and a fresh machine have); jsii prints a 12-line
# end-of-life banner on every synth for it. Node 22/24 print nothing either way.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from selector.errors import UserError
from stacks.settings import from_context


def main() -> None:
    import aws_cdk as cdk
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App()
    try:
        settings = from_context(_context(app))
        from stacks.training_stack import TrainingStack
        TrainingStack.for_settings(app, settings, synthesizer=_synthesizer(settings))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    # Every synth is checked: cdk-nag's AwsSolutions pack, through CDK's policy validation.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()


def _synthesizer(settings):
    """`-c local=true`: a synthesizer that needs no bootstrap stack (the local moto deploy);
    otherwise CDK's default, which uses the account's bootstrap resources."""
    if not settings.local:
        return None
    import aws_cdk as cdk
    return cdk.LegacyStackSynthesizer()


def _context(app) -> dict:
    # Everything, typos included, so that settings can name the closest valid key.
    return dict(app.node.get_all_context() or {})


if __name__ == "__main__":
    main()
