"""The broker's OpenAPI document: every request body and answer, the fast routes' too.

Routes read their bodies themselves (gzip, msgpack, size limits), so FastAPI cannot see them;
:func:`request_body` declares one from its protocol model for both encodings, and
:func:`install_body_schemas` adds the models those bodies refer to to the document's
components, so that schema-driven clients and fuzzers (schemathesis) know every body.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from pydantic import TypeAdapter

from atroposlib.wire.broker import ErrorResponse
from atroposlib.wire.common import JSON_CONTENT_TYPE, MSGPACK_CONTENT_TYPE

logger = logging.getLogger(__name__)

_REF = "#/components/schemas/{model}"
_BODY_SCHEMAS: dict[str, Any] = {}

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Unreadable body (bad JSON, msgpack or gzip)"),
        (401, "Missing or wrong bearer token"),
        (403, "A browser's request for another site"),
        (404, "Unknown env id"),
        (409, "No trainer registered yet"),
        (413, "Body too large"),
        (422, "A field breaks the contract; detail names it and the fix"),
        (503, "Queue full or store cannot write; retry after Retry-After seconds"),
    )
}
"""Every error the broker answers: ``{"detail": ...}``."""


LATEST_EXAMPLE: dict[str, Any] = {
    "description": "The last accepted group, or (as Atropos) every field as [] before any",
    "content": {
        JSON_CONTENT_TYPE: {
            "schema": {
                "anyOf": [
                    {"$ref": _REF.format(model="ScoredData")},
                    {"type": "object", "additionalProperties": {"type": "array", "maxItems": 0}},
                ]
            }
        }
    },
}


def request_body(body_type: Any, description: str) -> dict[str, Any]:
    """``openapi_extra`` declaring a required body of ``body_type`` as JSON or msgpack."""
    schema = TypeAdapter(body_type).json_schema(ref_template=_REF)
    _BODY_SCHEMAS.update(schema.pop("$defs", {}))
    if "title" in schema and "properties" in schema:  # a model: refer to it as a component
        _BODY_SCHEMAS[schema["title"]] = schema
        schema = {"$ref": _REF.format(model=schema["title"])}
    content = {media: {"schema": schema} for media in (JSON_CONTENT_TYPE, MSGPACK_CONTENT_TYPE)}
    return {"requestBody": {"required": True, "description": description, "content": content}}


def install_body_schemas(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the components that request bodies refer to."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in _BODY_SCHEMAS.items():
                components.setdefault(name, schema)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
