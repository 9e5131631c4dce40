"""One set of helpers for every benchmark: :mod:`.http` (talking to the service), :mod:`.stats`
(percentiles), :mod:`.cli` (flags, progress bars, output files), :mod:`.markdown` (report
tables), :mod:`.processes` (the service and judges, in-process or as child processes) and
:mod:`.database` (scratch databases)."""
