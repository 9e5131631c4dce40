"""The wire contract of the HTTP API (v1): every request and response body, and the field types
and checks they are built of. Their field descriptions are the OpenAPI document's.

One module a group of routes: ``memories`` (``/memories``), ``retrieve`` (``/retrieve``,
``/feedback``), ``rerank`` (the rerank protocol), ``queries`` (``GET /queries/{id}``),
``namespaces`` (``DELETE /namespaces/{namespace}``), ``stats`` (``/stats``), ``health``
(``/healthz``, ``/readyz``) and ``errors`` (the error body); ``fields`` holds what they share.

The bottom of the dependency rule beside ``service.checks``: nothing of earm's is imported here
but ``service.checks`` and this package, so every layer may import the contract (the HTTP
routes read and answer it, the pipeline and the database build the response bodies that are its
result types) and ``service.client`` needs nothing else of the service. Response bodies are
frozen dataclasses (FastAPI serves them, the client reads them back with pydantic); request
bodies are pydantic models that refuse unknown fields.
"""
