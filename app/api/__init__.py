"""The HTTP layer: thin routes over the engine, one router per resource.

Routers: :mod:`~app.api.tables`, :mod:`~app.api.items`, :mod:`~app.api.sampling`,
:mod:`~app.api.ops` (health, readiness, metrics) and :mod:`~app.api.docs` (offline docs).
"""
