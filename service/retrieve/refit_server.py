"""The refit fork server's preload (:class:`service.retrieve.refit_process.ChildRefits`), imported
by that server alone: it loads what a refit child runs, and it ties the server's life to the
process that started it.

The server would otherwise outlive a killed service: it exits when its "alive" pipe closes,
but every child it forks holds that pipe open, and an idle refit child (waiting for its next
refit) only dies with its own parent, the server. Killed with the service, the server takes
its children with it (each has the same death signal)."""

from service.retrieve import refit_process

# The death signal follows the thread that started the server: the event loop's, which lives
# as long as the service (a refit is submitted from the loop, never from a worker thread).
refit_process.die_with_parent()
