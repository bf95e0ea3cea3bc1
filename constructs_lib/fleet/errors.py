"""The one thing the fleet package reads from a botocore error, without importing botocore."""
from __future__ import annotations


def error_code(e: BaseException) -> str:
    """AWS's error code ('InsufficientInstanceCapacity', 'NoSuchKey', ...), or '' for other exceptions."""
    response = getattr(e, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""
