"""The retrieve flow: the pipeline (embed, search, anchors, score, complete, rerank) and
learning (record, online re-solve, feedback, refit)."""
