"""The API's routers, one module per resource; each translates JSON to a domain call and back."""
