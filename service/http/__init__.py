"""FastAPI only: the app factory, middleware, dependencies, error handlers and routes. The bodies
the routes read and answer are the wire contract's (``service.api``). Nothing below this package
knows about HTTP."""
