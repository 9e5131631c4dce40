"""The benchmarks of ``earm bench`` and the loopback stand-ins tests and benchmarks share.

- :mod:`service.bench.common`: what every benchmark needs (HTTP checks, statistics, command-line
  helpers, markdown tables, the service and judge processes, scratch databases);
- :mod:`service.bench.locomo`: ``earm bench locomo``, the LoCoMo replay;
- :mod:`service.bench.load`: ``earm bench load``, scale and speed against the pgvector floor;
- :mod:`service.bench.load_mix`: ``earm bench load-mix``, a mixed load and an audit;
- :mod:`service.bench.hnsw`: ``earm bench hnsw``, the HNSW build parameters;
- :mod:`service.bench.loopback`: real HTTP stand-ins for the LLM and embedding providers.
"""
