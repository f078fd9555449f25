"""Travel booking, a saga: book a flight, then a hotel; if the hotel fails, cancel the flight.

``book_flight`` is ``compensable``: its undo, ``cancel_flight``, is declared next to it, and
every committed booking registers that undo in the tool layer. ``book_hotel`` and
``cancel_flight`` are ``keyed`` (the travel API honours Idempotency-Key);
``find_trip_bookings`` is a read. In some samples the hotel is sold out (a definite 422): the
trip has failed and the flight must be cancelled exactly once, and never booked twice.

:func:`saga_end_state` is the scorer's end-state check: it fails a trial that leaves a booked
flight on a failed trip, cancels a booking twice, holds two live flight bookings on one trip,
or keeps a hotel whose flight is gone, and names the effects behind the verdict.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.tool import Tool
from twice.mocks import Effect, Ledger, Service, TravelService, services_from_state
from twice.tasks._dataset import load_dataset
from twice.tasks._interfaces import dollars
from twice.tasks._toolkit import Compensation, TrialContext, make_tool
from twice.tasks._trial import twice_task

DATASET = Path(__file__).parent / "dataset.jsonl"

FLIGHT_BOOK = "travel.flight.book"
FLIGHT_CANCEL = "travel.flight.cancel"
HOTEL_BOOK = "travel.hotel.book"


def _services(state: dict[str, Any]) -> list[Service]:
    return services_from_state(state, TravelService)


def _flight(b: dict[str, Any]) -> str:
    return (
        f"flight booking {b['id']}: flight {b['flight_id']} {b['origin']}→{b['destination']} "
        f"on {b['date']} for {b['traveler']} (trip {b['trip_id']}), fare {dollars(b['fare'])}, "
        f"status {b['status']}"
    )


def _hotel(b: dict[str, Any]) -> str:
    return (
        f"hotel booking {b['id']}: {b['hotel_name']}, {b['nights']} night(s) from "
        f"{b['check_in']} for {b['traveler']} (trip {b['trip_id']}), total "
        f"{dollars(b['total'])}"
    )


def _cancellation(c: dict[str, Any]) -> str:
    return (
        f"cancellation {c['id']} of flight booking {c['booking_id']} (trip {c['trip_id']}), "
        f"fare refunded {dollars(c['refund_amount'])}"
    )


def travel_tools(ctx: TrialContext) -> list[Tool]:
    """The travel booking task's tools, bound to one trial."""
    travel = ctx.api("travel")

    async def trip(trip_id: str) -> dict[str, Any]:
        data: dict[str, Any] = await travel.get(f"/v1/trips/{trip_id}")
        return data

    async def book_flight(trip_id: str, traveler: str, flight_id: str) -> str:
        """Book a seat on a flight for a traveler, as part of a trip. This charges the fare.

        Args:
            trip_id: The trip this booking belongs to, e.g. "trip_2001".
            traveler: The traveler's full name.
            flight_id: The flight to book, e.g. "TW412".
        """

        async def lookup() -> dict[str, Any] | None:
            data = await trip(trip_id)
            live = [
                b
                for b in data["flight_bookings"]
                if b["flight_id"] == flight_id and b["status"] == "booked"
            ]
            return dict(live[-1]) if live else None

        result = await travel.mutate(
            FLIGHT_BOOK,
            "/v1/flight_bookings",
            payload={"trip_id": trip_id, "traveler": traveler, "flight_id": flight_id},
            identity={"trip_id": trip_id},
            noun="flight booking",
            lookup=lookup,
        )
        return result.say("Booked", _flight(result.body))

    async def book_hotel(
        trip_id: str, traveler: str, hotel_id: str, check_in: str, nights: int
    ) -> str:
        """Book a hotel room for a traveler, as part of a trip. This charges the stay.

        Args:
            trip_id: The trip this booking belongs to, e.g. "trip_2001".
            traveler: The traveler's full name.
            hotel_id: The hotel to book, e.g. "htl_berlin_mitte".
            check_in: Check-in date, YYYY-MM-DD.
            nights: Number of nights.
        """

        async def lookup() -> dict[str, Any] | None:
            data = await trip(trip_id)
            found = [b for b in data["hotel_bookings"] if b["hotel_id"] == hotel_id]
            return dict(found[-1]) if found else None

        result = await travel.mutate(
            HOTEL_BOOK,
            "/v1/hotel_bookings",
            payload={
                "trip_id": trip_id,
                "traveler": traveler,
                "hotel_id": hotel_id,
                "check_in": check_in,
                "nights": nights,
            },
            identity={"trip_id": trip_id},
            noun="hotel booking",
            lookup=lookup,
        )
        return result.say("Booked", _hotel(result.body))

    async def cancel_flight(booking_id: str) -> str:
        """Cancel a flight booking and refund its fare. Use it to undo a booking.

        Args:
            booking_id: The flight booking to cancel, e.g. "fb_1".
        """

        async def lookup() -> dict[str, Any] | None:
            booking = await travel.get(f"/v1/flight_bookings/{booking_id}")
            data = await trip(str(booking["trip_id"]))
            found = [c for c in data["cancellations"] if c["booking_id"] == booking_id]
            return dict(found[-1]) if found else None

        result = await travel.mutate(
            FLIGHT_CANCEL,
            f"/v1/flight_bookings/{booking_id}/cancel",
            payload={},
            identity={"booking_id": booking_id},
            noun="cancellation",
            lookup=lookup,
        )
        return result.say("Cancelled:", _cancellation(result.body))

    async def find_trip_bookings(trip_id: str) -> str:
        """List a trip's flight bookings, hotel bookings and cancellations. Read-only, safe.

        Args:
            trip_id: The trip to look up, e.g. "trip_2001".
        """
        data = await trip(trip_id)
        flights, hotels = data["flight_bookings"], data["hotel_bookings"]
        cancellations = data["cancellations"]
        if not flights and not hotels:
            return f"Trip {trip_id} has no bookings."
        parts = [f"Trip {trip_id}:"]
        parts += [f"{_flight(b)};" for b in flights] or ["no flight bookings;"]
        parts += [f"{_hotel(b)};" for b in hotels] or ["no hotel bookings;"]
        parts += [f"{_cancellation(c)};" for c in cancellations]
        return " ".join(parts).rstrip(";") + "."

    return [
        make_tool(
            ctx,
            book_flight,
            idempotency="compensable",
            compensation=Compensation("cancel_flight", lambda b: {"booking_id": b["id"]}),
            verify_with="find_trip_bookings",
            parallel=True,
        ),
        make_tool(
            ctx, book_hotel, idempotency="keyed", verify_with="find_trip_bookings", parallel=True
        ),
        make_tool(
            ctx,
            cancel_flight,
            idempotency="keyed",
            verify_with="find_trip_bookings",
            parallel=True,
        ),
        make_tool(ctx, find_trip_bookings),
    ]


def _ids(ledger: Ledger, effects: list[Effect]) -> str:
    return "; ".join(ledger.describe_effect(e) for e in effects)


def saga_end_state(ledger: Ledger, metadata: dict[str, Any]) -> str | None:
    """The travel saga's end-state check (an ``assertions.EndStateCheck``).

    For every trip named by the sample's intents or by an effect, the end state is consistent
    when the trip either holds exactly one live flight booking and a hotel booking (it
    succeeded), or holds neither (it failed and was compensated, or never started). Also
    inconsistent: a flight booking cancelled more than once.

    Returns:
        None when every trip is consistent; otherwise every problem found, naming the
        effects behind it (``fb_1 at attempt 1 (initial), reply lost``).
    """
    trips: dict[str, dict[str, list[Effect]]] = defaultdict(lambda: defaultdict(list))
    for intent in metadata.get("intents", []):
        trip_id = intent.get("identity", {}).get("trip_id")
        if trip_id is not None:
            trips.setdefault(trip_id, defaultdict(list))  # checked even with no effects
    for e in ledger.effects:
        if e.name in (FLIGHT_BOOK, FLIGHT_CANCEL, HOTEL_BOOK):
            trips[str(e.fields.get("trip_id"))][e.name].append(e)

    problems: list[str] = []
    for trip_id, by_name in trips.items():
        bookings = by_name[FLIGHT_BOOK]
        hotels = by_name[HOTEL_BOOK]
        cancels: dict[str, list[Effect]] = defaultdict(list)
        for c in by_name[FLIGHT_CANCEL]:
            cancels[str(c.fields.get("booking_id"))].append(c)
        live = [b for b in bookings if b.id not in cancels]

        for booking_id, cs in cancels.items():
            if len(cs) > 1:
                problems.append(
                    f"trip {trip_id}: flight booking {booking_id} cancelled {len(cs)} times "
                    f"(double cancellation): {_ids(ledger, cs)}"
                )
        if len(live) > 1:
            problems.append(
                f"trip {trip_id}: {len(live)} live flight bookings (double booking): "
                f"{_ids(ledger, live)}"
            )
        if live and not hotels:
            problems.append(
                f"trip {trip_id} has no hotel booking, so the trip failed, but flight "
                f"booking(s) were left booked and never cancelled: {_ids(ledger, live)}"
            )
        if hotels and not live:
            problems.append(
                f"trip {trip_id}: hotel booked but no live flight booking "
                f"(flight cancelled or never booked): {_ids(ledger, hotels)}"
            )
    return "; ".join(problems) or None


@task
def travel_booking(
    fault: str = "none",
    protection: str = "bare",
    prompt: str = "baseline",
    action_log: bool | None = None,
    agent: str = "react",
    mocks: dict[str, str] | None = None,
) -> Task:
    """Book a flight then a hotel; if the hotel fails for good, cancel the flight (a saga).

    Args:
        fault: What the travel API does wrong (``twice list`` shows the faults).
        protection: What the tool layer does about retries.
        prompt: A built-in prompt name or a prompt file path.
        action_log: Keep a durable action log (None: as the protection says).
        agent: The agent under test (``react``: twice's own loop; ``twice list`` shows more).
        mocks: Production URL by service name, served by the trial's services (user agents).
    """
    return twice_task(
        name="travel_booking",
        dataset=load_dataset(DATASET, "travel_booking"),
        services=_services,
        tools=travel_tools,
        fault=fault,
        protection=protection,
        prompt=prompt,
        end_state=saga_end_state,
        action_log=action_log,
        agent=agent,
        mocks=mocks,
    )
