"""The benchmarks of ``earm bench`` (the earm-bench distribution, outside the product's wheel).

- :mod:`earm_bench.common`: what every benchmark needs (HTTP checks, statistics, command-line
  helpers, markdown tables, the service and judge processes, scratch databases);
- :mod:`earm_bench.locomo`: ``earm bench locomo``, the LoCoMo replay;
- :mod:`earm_bench.load`: ``earm bench load``, scale and speed against the pgvector floor;
- :mod:`earm_bench.cli`: ``earm bench`` itself, registered with the product's command line.

The real HTTP stand-ins of the LLM and embedding providers that the benchmarks serve their
judges with are the product's :mod:`service.testing`.
"""
