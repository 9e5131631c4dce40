"""``earm demo``'s parts: the bundled workload, the simulated scorer that answers from its labels,
the replay through the HTTP API, and the report of what it cost and learned."""
