"""The httpx clients of a :class:`Services` set, with a cookie jar that reads only the
responses that set a cookie."""

from __future__ import annotations

from typing import Any

import httpx


class _Cookies(httpx.Cookies):
    """A client's cookie jar that reads only the responses that set a cookie.

    httpx hands every response to the standard library's cookie jar, wrapping request and
    response in urllib objects first (the request's URL parsed again): about a sixth of a
    mock request's client-side CPU, for services that rarely set a cookie. A response that
    sets one is read exactly as httpx reads it.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        if "set-cookie" in response.headers:  # case-insensitive, as HTTP header names are
            super().extract_cookies(response)


class _ReadsCookiesOnDemand:
    """Mixed into httpx's clients: their cookies live in a :class:`_Cookies` jar, through the
    public ``cookies`` property (the one place httpx reads and sets a client's cookies)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cookies = super().cookies  # type: ignore[misc]  # the setter below

    @property
    def cookies(self) -> httpx.Cookies:
        return self._twice_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        self._twice_cookies = _Cookies(cookies)


class AsyncClient(_ReadsCookiesOnDemand, httpx.AsyncClient):
    pass


class Client(_ReadsCookiesOnDemand, httpx.Client):
    pass
