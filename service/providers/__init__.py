"""What earm calls outside itself: the embedder (text to vectors) and the relevance scorer
(the expensive oracle), with one retry policy (``retry``) for both. ``factory`` builds the
ones the settings select."""
