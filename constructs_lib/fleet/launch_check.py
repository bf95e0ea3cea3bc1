"""The deploy-time proof that the controller may launch: the CreateFleet request of every option,
exactly as a real launch would send it (instances.fleet_request), with DryRun=True, from the
controller's own role. EC2 answers DryRunOperation when IAM would allow the launch; anything else
fails the custom resource (Custom::DlLauncherLaunchCheck), and with it the deploy, with AWS's
reason: a policy mistake shows at deploy instead of as a cluster that never starts.
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Optional

from dl_core.aws import error_code

from .instances import fleet_request
from .spec import ClusterSpec

RESOURCE_TYPE = "Custom::DlLauncherLaunchCheck"
ALLOWED = "DryRunOperation"
DENIED = "UnauthorizedOperation"
# A role and policy CloudFormation has just made can take seconds to reach every IAM endpoint:
# a denial is asked again after these pauses (seconds) before it fails the deploy.
RETRY_PAUSES = (5.0, 10.0, 15.0, 30.0)
_ENCODED = re.compile(r"Encoded authorization failure message:\s*(\S+)")


class LaunchDenied(Exception):
    """The dry run's answer was not DryRunOperation; str() is the reason for CloudFormation."""


def check_launch(ec2: Any, spec: ClusterSpec, *, sts: Any = None,
                 sleep: Optional[Callable[[float], None]] = None) -> str:
    """Dry-run every option's launch; returns a summary, raises LaunchDenied with AWS's reason."""
    for option in spec.options:
        request = {**fleet_request(spec, option, spec.nodes, spec.subnet_ids, spec.nodes), "DryRun": True}
        for pause in (*RETRY_PAUSES, None):
            try:
                ec2.create_fleet(**request)
            except Exception as e:  # noqa: BLE001 - every answer is judged below
                code = error_code(e)
                if code == ALLOWED:
                    break
                if code == DENIED and pause is not None:
                    (sleep or time.sleep)(pause)  # looked up here, so a test's patch of time.sleep holds
                    continue
                raise LaunchDenied(_reason(option.instance_type, option.launch_template_id, e, sts)) from None
            # No error at all: a dry run that would have launched is not a proof of anything.
            raise LaunchDenied(f"CreateFleet for {option.instance_type} answered a DryRun without DryRunOperation: "
                               "the endpoint does not check permissions, so nothing is proven")
    return f"the controller's role may launch {', '.join(o.instance_type for o in spec.options)} (CreateFleet DryRun)"


def _reason(instance_type: str, template: str, e: BaseException, sts: Any) -> str:
    code = error_code(e) or type(e).__name__
    head = f"the controller's role may not launch {instance_type} from {template}: {code}"
    if code != DENIED:
        return f"{head}: {e}"
    found = _ENCODED.search(str(e))
    if not found:
        return f"{head}: {e}"
    decoded = _decode(sts, found.group(1))
    if decoded:
        return f"{head}: {decoded}"
    # Not decodable here (no sts:DecodeAuthorizationMessage): the message for `aws sts
    # decode-authorization-message`, cut to what CloudFormation shows.
    return f"{head}; decode with aws sts decode-authorization-message --encoded-message {found.group(1)[:600]}"


def _decode(sts: Any, encoded: str) -> Optional[str]:
    if sts is None:
        return None
    try:
        doc = json.loads(sts.decode_authorization_message(EncodedMessage=encoded)["DecodedMessage"])
    except Exception:  # noqa: BLE001 - decoding is a courtesy; the encoded message still says it all
        return None
    context = doc.get("context") or {}
    why = "an explicit Deny matches it" if doc.get("explicitDeny") else "no statement allows it"
    return f"{context.get('action', '?')} on {context.get('resource', '?')} is denied: {why}"
