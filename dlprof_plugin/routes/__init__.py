"""The route groups of the HTTP API (http_api.md), each a module with `routes(service) -> {route: handler}`
(and `tables(service)` where it adds tables), over the request/reply layer of `dlprof_plugin.replies`: a handler
takes (request, ctx, eid), returns a `Reply` and raises a `PublicError` to answer with an HTTP status."""
