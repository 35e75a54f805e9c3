"""Schema fuzzing shared by the broker's, the inference server's and the proxy's tests:
schemathesis generates each operation's bodies and parameters from the server's OpenAPI
document and sends them to the real server; each check must hold for every answer."""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings


def fuzz_operations(
    url: str,
    checks: list[Callable[..., Any]],
    *,
    headers: dict[str, str] | None = None,
    max_examples: int = 25,
    skip: Container[str] = (),
    path_parameters: dict[str, str] | None = None,
    schema_headers: dict[str, str] | None = None,
) -> dict[str, set[int]]:
    """Fuzz every operation of ``{url}/openapi.json`` (a server started with
    ``--expose-api-docs``; fetched with ``schema_headers``, else ``headers``) but those
    labelled in ``skip`` (``"POST /pause"``), with ``path_parameters`` (a real session's id)
    in place of generated ones; the statuses each operation fuzzed answered, by label."""
    document_headers = schema_headers or headers or {}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=document_headers)
    tested: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label in skip:
            continue
        seen = tested.setdefault(operation.label, set())

        @given(case=operation.as_strategy())
        @settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck))
        def call(case: Any) -> None:
            if path_parameters and case.path_parameters:
                case.path_parameters = {**case.path_parameters, **path_parameters}
            response = case.call_and_validate(checks=checks, headers=headers, timeout=60)
            seen.add(response.status_code)  # noqa: B023 - called before the loop moves on

        call()
    return tested
