"""Test doubles: mock services on a per-trial respx router, the ledger, faults, stub models.

The stub model provider is registered with inspect through the package's entry point
(``mocks._registry``), so ``--model stub/NAME`` resolves from any inspect command.
"""

from ._faults import (
    CRASH_HEADER,
    FAULTS,
    CrashAfterCommit,
    ErrorAfterCommit,
    ErrorBeforeCommit,
    Fault,
    LostReply,
    NoFault,
    RateLimited,
    Schedule,
    TimeoutBeforeCommit,
    get_fault,
)
from ._idempotency import MAX_KEY_LENGTH, IdempotencyStore
from ._ledger import (
    LEDGER_STORE_KEY,
    RETRY_SOURCES,
    Attempt,
    Effect,
    Ledger,
    Outcome,
    outcome_of,
)
from ._service import (
    BACKOFF_HEADER,
    CALL_HEADER,
    KEY_HEADER,
    SOURCE_HEADER,
    Call,
    Route,
    Service,
    Services,
    error_response,
)
from ._stub import (
    NOISY_DEFAULT_RATE,
    NOISY_RETRY_RATES,
    STUB_MODELS,
    STUB_STORE_KEY,
    UNKNOWN_OUTCOME,
    StubAPI,
    noisy_retry_rate,
)
from .services import (
    EmailService,
    OrdersService,
    PaymentsService,
    RecordsService,
    TicketsService,
    TravelService,
)

__all__ = [
    "BACKOFF_HEADER",
    "CALL_HEADER",
    "CRASH_HEADER",
    "FAULTS",
    "KEY_HEADER",
    "LEDGER_STORE_KEY",
    "MAX_KEY_LENGTH",
    "NOISY_DEFAULT_RATE",
    "NOISY_RETRY_RATES",
    "RETRY_SOURCES",
    "SOURCE_HEADER",
    "STUB_MODELS",
    "STUB_STORE_KEY",
    "UNKNOWN_OUTCOME",
    "Attempt",
    "Call",
    "CrashAfterCommit",
    "Effect",
    "EmailService",
    "ErrorAfterCommit",
    "ErrorBeforeCommit",
    "Fault",
    "IdempotencyStore",
    "Ledger",
    "LostReply",
    "NoFault",
    "OrdersService",
    "Outcome",
    "PaymentsService",
    "RateLimited",
    "RecordsService",
    "Route",
    "Schedule",
    "Service",
    "Services",
    "StubAPI",
    "TicketsService",
    "TimeoutBeforeCommit",
    "TravelService",
    "error_response",
    "get_fault",
    "noisy_retry_rate",
    "outcome_of",
]
