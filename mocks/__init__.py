"""Test doubles: mock services on a per-trial respx router, the ledger, faults, stub models.

The stub model provider is registered with inspect through the package's entry point
(``mocks._registry``), so ``--model stub/NAME`` resolves from any inspect command.
"""

from ._errors import RunError, TwiceError, UsageError
from ._fault_hits import FaultHits
from ._faults import (
    BOTH_CONVERSATIONS,
    CONVERSATION_FAULTS,
    CRASH_HEADER,
    FAULTS,
    CrashAfterCommit,
    ErrorAfterCommit,
    ErrorBeforeCommit,
    Fault,
    LostReply,
    NoFault,
    RateLimited,
    ResetAfterCommit,
    Schedule,
    ServerErrorAfterCommit,
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
    describe_effect,
    flush_ledger,
    keep_ledger,
    ledger_of,
    ledgers,
    live_ledger,
    outcome_of,
)
from ._live import forget_held_metadata, keep_held_metadata, trial_metadata
from ._openapi import OpenAPIService, openapi_service
from ._openapi_plan import OpenAPIError
from ._openapi_tools import OpenAPIArgument, OpenAPIOperation, openapi_operations
from ._own_transport import start as start_own_transport
from ._own_transport import stop as stop_own_transport
from ._own_transport import through_own_transport
from ._service import Call, Route, Service, services_from_state
from ._stub import (
    NOISY_DEFAULT_RATE,
    NOISY_RETRY_RATES,
    STUB_MODELS,
    StubAPI,
    noisy_retry_rate,
)
from ._stub_config import (
    STUB_STORE_KEY,
    StubCannotPlay,
    forget_stub_config,
    keep_stub_config,
    raise_if_stub_could_not_play,
)
from ._stub_react import react_action
from ._stub_transcript import UNKNOWN_OUTCOME
from ._trial_services import Services
from ._wire import (
    BACKOFF_HEADER,
    CALL_HEADER,
    FORM_TYPE,
    KEY_HEADER,
    REPLAYED_HEADER,
    SOURCE_HEADER,
    error_response,
    not_found,
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
    "BOTH_CONVERSATIONS",
    "CALL_HEADER",
    "CONVERSATION_FAULTS",
    "CRASH_HEADER",
    "FAULTS",
    "FORM_TYPE",
    "KEY_HEADER",
    "LEDGER_STORE_KEY",
    "MAX_KEY_LENGTH",
    "NOISY_DEFAULT_RATE",
    "NOISY_RETRY_RATES",
    "REPLAYED_HEADER",
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
    "FaultHits",
    "IdempotencyStore",
    "Ledger",
    "LostReply",
    "NoFault",
    "OpenAPIArgument",
    "OpenAPIError",
    "OpenAPIOperation",
    "OpenAPIService",
    "OrdersService",
    "Outcome",
    "PaymentsService",
    "RateLimited",
    "RecordsService",
    "ResetAfterCommit",
    "Route",
    "RunError",
    "Schedule",
    "ServerErrorAfterCommit",
    "Service",
    "Services",
    "StubAPI",
    "StubCannotPlay",
    "TicketsService",
    "TimeoutBeforeCommit",
    "TravelService",
    "TwiceError",
    "UsageError",
    "describe_effect",
    "error_response",
    "flush_ledger",
    "forget_held_metadata",
    "forget_stub_config",
    "get_fault",
    "keep_held_metadata",
    "keep_ledger",
    "keep_stub_config",
    "ledger_of",
    "ledgers",
    "live_ledger",
    "noisy_retry_rate",
    "not_found",
    "openapi_operations",
    "openapi_service",
    "outcome_of",
    "raise_if_stub_could_not_play",
    "react_action",
    "services_from_state",
    "start_own_transport",
    "stop_own_transport",
    "through_own_transport",
    "trial_metadata",
]
