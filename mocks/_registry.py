from ._stub import stub  # noqa: F401  (registers the "stub" model provider)
