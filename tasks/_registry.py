from .refund import refund  # noqa: F401  (registers tasks/refund)
