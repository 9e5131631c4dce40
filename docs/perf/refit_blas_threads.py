"""A full refit's fit (``fit_model``) on synthetic data of the capacity bench's shape (2,000
memories, 35 observations per query), BLAS on its default threads and on one; median of three.

    PYTHONPATH=. python docs/perf/refit_blas_threads.py 200000 1000000
"""

from __future__ import annotations

import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from service.completion.model import fit_model


def fit_once(n_obs: int) -> tuple[float, float]:
    """Wall and CPU seconds of one fit."""
    rng = np.random.default_rng(0)
    n_m, n_q = 2000, n_obs // 35
    memory_idx = rng.integers(0, n_m, n_obs)
    query_idx = rng.integers(0, n_q, n_obs)
    embeddings = rng.normal(size=(n_m, 384))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    began, cpu = time.perf_counter(), time.process_time()
    fit_model(memory_idx, query_idx, rng.random(n_obs), rng.random(n_obs), n_m, n_q, rank=8,
              reg=1.0, n_iterations=5, memory_embeddings=embeddings)
    return time.perf_counter() - began, time.process_time() - cpu


def main(sizes: list[int]) -> None:
    for n_obs in sizes:
        for label, limit in (("default", None), ("one", 1)):
            with threadpool_limits(limits=limit, user_api="blas"):
                wall, cpu = sorted(fit_once(n_obs) for _ in range(3))[1]
            print(f"{n_obs:>9,} observations, BLAS threads {label:>7}: "
                  f"wall {wall:.2f} s, CPU {cpu:.2f} s")


if __name__ == "__main__":
    main([int(size) for size in sys.argv[1:]])
