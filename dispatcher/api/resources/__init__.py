"""The API's resources: one class per route template, one module per route group.

``base`` holds what every responder shares (the app's context, the
``Resource`` base, authentication, the read route); ``deliveries`` (history,
replay, recover), ``endpoints`` (endpoints, breaker close, secret rotation),
``tokens``, ``workspace``, ``audit``, ``stats``, ``health`` and ``documents``
(OpenAPI, console) each hold one group.  ``api.app`` wires them to their
routes; the JSON shapes they answer with live in ``dispatcher.views``.
"""
