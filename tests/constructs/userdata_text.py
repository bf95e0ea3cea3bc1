"""A launch template's UserData as the node will receive it: CloudFormation's intrinsic
functions evaluated with fixed pseudo parameters (and given values for other Refs)."""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

PSEUDO = {"AWS::Region": "us-east-1", "AWS::AccountId": "123456789012", "AWS::Partition": "aws",
          "AWS::URLSuffix": "amazonaws.com"}


def evaluate(value: Any, refs: Optional[Mapping[str, str]] = None) -> Any:
    refs = {**PSEUDO, **(refs or {})}

    def ev(v: Any) -> Any:
        if isinstance(v, (str, int)):
            return v
        if isinstance(v, list):
            return [ev(i) for i in v]
        (fn, arg), = v.items()
        if fn == "Fn::Base64":
            return ev(arg)
        if fn == "Fn::Join":
            return arg[0].join(str(ev(i)) for i in arg[1])
        if fn == "Ref":
            return refs.get(arg, f"<{arg}>")
        if fn == "Fn::Sub":
            return re.sub(r"\$\{([^}]+)\}", lambda m: refs.get(m[1], f"<{m[1]}>"), arg if isinstance(arg, str) else arg[0])
        if fn == "Fn::Select":
            return ev(arg[1])[arg[0]]
        if fn == "Fn::Split":
            return ev(arg[1]).split(arg[0])
        if fn == "Fn::GetAtt":
            return f"<{'.'.join(arg)}>"
        raise ValueError(f"cannot evaluate {fn}")

    return ev(value)


def user_data_text(launch_template_data: dict, refs: Optional[Mapping[str, str]] = None) -> str:
    ud = launch_template_data["UserData"]
    assert set(ud) == {"Fn::Base64"}, "plain text user data, base64-encoded by CloudFormation"
    return evaluate(ud, refs)
