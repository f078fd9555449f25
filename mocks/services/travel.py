"""A travel API for a two-step saga: book a flight, then a hotel; cancel the flight to undo.

Effects: ``travel.flight.book`` (``fb_1``), ``travel.flight.cancel`` (``fc_1``, a cancellation
that refunds the fare) and ``travel.hotel.book`` (``hb_1``). Every effect carries the client's
``trip_id`` so the checks can group a trip's effects. Amounts are integer cents.

Check-then-act is atomic: each handler checks and commits without yielding (seats, rooms,
booking status), and keyed requests go through the shared in-flight (409) path.

A hotel with no rooms left answers 422 ``sold_out``: a definite failure, the saga's step that
"fails for good". Cancelling a cancelled booking answers 400 ``booking_already_cancelled``,
unless the service runs with ``legacy_cancel=True``: then, like some legacy airline back ends,
every cancel call refunds the fare again without checking the booking's status, so a repeated
cancel is a second ``travel.flight.cancel`` effect (a double cancellation).
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from .._service import Call, Route, Service
from .._wire import error_response, not_found


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class TravelService(Service):
    """Flights and hotels to book, flight bookings to cancel, and lookups by trip and booking.

    Args:
        flights: Bookable flights, each with ``flight_id``, ``origin``, ``destination``,
            ``date``, ``fare`` (cents) and ``seats`` (seats left).
        hotels: Bookable hotels, each with ``hotel_id``, ``name``, ``city``, ``rate``
            (cents per night) and ``rooms`` (rooms left; 0 means sold out).
        legacy_cancel: Cancel without checking the booking's status (each call refunds).
        base_url: Where the API lives (default ``https://travel.twice.test``).
    """

    name: ClassVar[str] = "travel"
    default_base_url: ClassVar[str] = "https://travel.twice.test"

    def __init__(
        self,
        flights: list[dict[str, Any]] | None = None,
        hotels: list[dict[str, Any]] | None = None,
        legacy_cancel: bool = False,
        base_url: str | None = None,
    ) -> None:
        super().__init__(base_url)
        self.flights: dict[str, dict[str, Any]] = {f["flight_id"]: dict(f) for f in flights or []}
        self.hotels: dict[str, dict[str, Any]] = {h["hotel_id"]: dict(h) for h in hotels or []}
        self.legacy_cancel = legacy_cancel
        self.flight_bookings: list[dict[str, Any]] = []
        self.cancellations: list[dict[str, Any]] = []
        self.hotel_bookings: list[dict[str, Any]] = []

    def routes(self) -> list[Route]:
        return [
            Route("GET", r"/v1/trips/(?P<trip_id>[^/?]+)", "travel.trip.get", self.get_trip),
            Route(
                "GET",
                r"/v1/flight_bookings/(?P<booking_id>[^/?]+)",
                "travel.flight.get",
                self.get_flight_booking,
            ),
            Route(
                "POST",
                r"/v1/flight_bookings",
                "travel.flight.book",
                self.book_flight,
                mutating=True,
            ),
            Route(
                "POST",
                r"/v1/flight_bookings/(?P<booking_id>[^/?]+)/cancel",
                "travel.flight.cancel",
                self.cancel_flight,
                mutating=True,
            ),
            Route(
                "POST", r"/v1/hotel_bookings", "travel.hotel.book", self.book_hotel, mutating=True
            ),
        ]

    # -- reads -----------------------------------------------------------------------------

    def get_trip(self, call: Call) -> httpx.Response:
        trip_id = call.params["trip_id"]
        return httpx.Response(
            200,
            json={
                "trip_id": trip_id,
                "flight_bookings": [b for b in self.flight_bookings if b["trip_id"] == trip_id],
                "hotel_bookings": [b for b in self.hotel_bookings if b["trip_id"] == trip_id],
                "cancellations": [c for c in self.cancellations if c["trip_id"] == trip_id],
            },
        )

    def get_flight_booking(self, call: Call) -> httpx.Response:
        booking_id = call.params["booking_id"]
        for booking in self.flight_bookings:
            if booking["id"] == booking_id:
                return httpx.Response(200, json=booking)
        return error_response(404, f"No such flight booking: {booking_id!r}")

    # -- writes ----------------------------------------------------------------------------

    def book_flight(self, call: Call) -> httpx.Response:
        p = call.params
        given = p.get("flight_id")
        flight = self.flights.get(str(given)) if isinstance(given, str | int) else None
        if flight is None:
            return not_found("flight", "flight_id", given)
        if not p.get("trip_id") or not p.get("traveler"):
            return error_response(400, "trip_id and traveler are required")
        if flight["seats"] <= 0:
            return error_response(
                422, f"Flight {flight['flight_id']} is full (no seats left)", type="sold_out"
            )
        flight["seats"] -= 1
        fields = {
            "trip_id": p["trip_id"],
            "traveler": p["traveler"],
            "flight_id": flight["flight_id"],
            "fare": flight["fare"],
        }
        effect = call.commit("travel.flight.book", "fb", fields)
        booking = {
            "id": effect.id,
            "object": "flight_booking",
            "status": "booked",
            "origin": flight["origin"],
            "destination": flight["destination"],
            "date": flight["date"],
            **fields,
        }
        self.flight_bookings.append(booking)
        return httpx.Response(200, json=booking)

    def cancel_flight(self, call: Call) -> httpx.Response:
        booking_id = call.params["booking_id"]
        booking = next((b for b in self.flight_bookings if b["id"] == booking_id), None)
        if booking is None:
            return error_response(404, f"No such flight booking: {booking_id!r}")
        if booking["status"] == "cancelled" and not self.legacy_cancel:
            return error_response(
                400,
                f"Flight booking {booking_id} is already cancelled",
                type="booking_already_cancelled",
            )
        if booking["status"] != "cancelled":
            booking["status"] = "cancelled"
            self.flights[booking["flight_id"]]["seats"] += 1
        fields = {
            "booking_id": booking_id,
            "trip_id": booking["trip_id"],
            "refund_amount": booking["fare"],
        }
        effect = call.commit("travel.flight.cancel", "fc", fields)
        cancellation = {"id": effect.id, "object": "flight_cancellation", **fields}
        self.cancellations.append(cancellation)
        return httpx.Response(200, json=cancellation)

    def book_hotel(self, call: Call) -> httpx.Response:
        p = call.params
        given = p.get("hotel_id")
        hotel = self.hotels.get(str(given)) if isinstance(given, str | int) else None
        if hotel is None:
            return not_found("hotel", "hotel_id", given)
        if not p.get("trip_id") or not p.get("traveler") or not p.get("check_in"):
            return error_response(400, "trip_id, traveler and check_in are required")
        nights = p.get("nights")
        if not _positive_int(nights):
            return error_response(400, f"nights must be a positive integer, got {nights!r}")
        if hotel["rooms"] <= 0:
            return error_response(
                422,
                f"{hotel['name']} has no rooms left from {p['check_in']} (sold out)",
                type="sold_out",
            )
        hotel["rooms"] -= 1
        fields = {
            "trip_id": p["trip_id"],
            "traveler": p["traveler"],
            "hotel_id": hotel["hotel_id"],
            "check_in": p["check_in"],
            "nights": nights,
            "total": hotel["rate"] * nights,
        }
        effect = call.commit("travel.hotel.book", "hb", fields)
        booking = {
            "id": effect.id,
            "object": "hotel_booking",
            "status": "booked",
            "hotel_name": hotel["name"],
            **fields,
        }
        self.hotel_bookings.append(booking)
        return httpx.Response(200, json=booking)
