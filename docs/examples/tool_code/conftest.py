import pytest
from twice.mocks import PaymentsService

pytest_plugins = ["twice.assertions.pytest_plugin"]


@pytest.fixture
def twice_services():
    """The services the tests run against, at the base URL the code calls."""
    order = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}
    return [PaymentsService(orders=[order], base_url="https://payments.example.com")]
