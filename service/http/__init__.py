"""FastAPI only: the app factory, middleware, dependencies, schemas, error handlers and routes.
Nothing below this package knows about HTTP."""
