"""The HTTP layer: thin routes over the engine, one router per resource.

Routers: :mod:`~rlreplay.app.api.tables`, :mod:`~rlreplay.app.api.items`,
:mod:`~rlreplay.app.api.sampling`,
:mod:`~rlreplay.app.api.health` (health, readiness, metrics) and :mod:`~rlreplay.app.api.docs`
(offline docs).
"""
