"""One BLAS thread in each earm process: its serving process, its refit children and
``earm worker``.

numpy's OpenBLAS starts a thread per core and runs each matrix product and factorisation on all
of them. earm's linear algebra is small — a refit's Gram matrix is (d + 1)², its per-row
solves are rank-sized — so the extra threads buy no time: on 2 cores a refit's fit at 200,000
observations took 1.52 s and 1.07 s of CPU on two threads, 1.03 s and 0.77 s on one
(docs/performance.md, "BLAS threads"). And between operations they spin on the cores that the
event loop, Postgres and the embedder need: on a busy 2-core machine a 385 × 385 Cholesky
factorisation took 17–380 ms on two threads against 8–13 ms on one.

threadpoolctl (the library scikit-learn uses for the same purpose) sets the limit at run time,
whenever numpy was imported, where the ``OPENBLAS_NUM_THREADS`` variable acts only before.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def one_blas_thread() -> None:
    """Limit this process's BLAS libraries to one thread, from now on."""
    threadpool_limits(limits=1, user_api="blas")
