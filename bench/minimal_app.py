"""A minimal hand-written CDK app declaring exactly the resources of a given template as raw L1
CfnResources: no selector, no constructs library. The baseline any CDK app pays for those
resources (jsii start-up, construct tree, synthesis). With BENCH_NAG=1 it also runs cdk-nag's
AwsSolutions pack, as every dl-launcher synth does, so that both sides do the same checks.

    BENCH_TEMPLATE=path/to/template.json cdk synth --app "python bench/minimal_app.py"
"""
import json
import os

import aws_cdk as cdk

template = json.load(open(os.environ["BENCH_TEMPLATE"]))
app = cdk.App()
stack = cdk.Stack(app, "Minimal", synthesizer=cdk.DefaultStackSynthesizer(generate_bootstrap_version_rule=False))
for name, p in template.get("Parameters", {}).items():
    if name != "BootstrapVersion":
        cdk.CfnParameter(stack, name, type=p["Type"], default=p.get("Default"))
for logical_id, r in template["Resources"].items():
    if r["Type"] == "AWS::CDK::Metadata":
        continue
    res = cdk.CfnResource(stack, logical_id, type=r["Type"], properties=r.get("Properties"))
    res.override_logical_id(logical_id)
    if "DeletionPolicy" in r:
        res.cfn_options.deletion_policy = cdk.CfnDeletionPolicy(r["DeletionPolicy"].upper().replace("RETAIN", "RETAIN"))
for name, o in template.get("Outputs", {}).items():
    cdk.CfnOutput(stack, name, value=o["Value"] if isinstance(o["Value"], str) else cdk.Token.as_string(o["Value"]))
if os.environ.get("BENCH_NAG") == "1":
    from cdk_nag import AwsSolutionsChecks
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    # the raw L1 copies carry no acknowledgments; findings are reported, not fatal, here
    try:
        app.synth()
    except RuntimeError:
        pass
else:
    app.synth()
