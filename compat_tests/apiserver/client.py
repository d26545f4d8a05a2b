"""A deliberately thin HTTP client for tests: it shows exactly what any client would receive.

No retries, no decoding into types, no version negotiation: a reply is the status code, the JSON
(or text) body and the headers; a watch yields each event line as parsed JSON until the server
ends the stream. Tests of the emulator use it to assert on the wire; driver tests can use it to
look at what the driver left on the server.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

GROUP_PATH = "/apis/resource.k8s.io"


def path(resource: str, version: str = "v1", name: str = "", namespace: str = "",
         subresource: str = "") -> str:
    """The REST path of a resource.k8s.io collection or object."""
    out = f"{GROUP_PATH}/{version}"
    if namespace:
        out += f"/namespaces/{namespace}"
    out += f"/{resource}"
    if name:
        out += f"/{name}"
    if subresource:
        out += f"/{subresource}"
    return out


@dataclass
class Reply:
    status: int
    body: Any
    headers: CIMultiDictProxy[str]

    @property
    def reason(self) -> str | None:
        return self.body.get("reason") if isinstance(self.body, dict) else None

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else ""

    @property
    def warnings(self) -> list[str]:
        return self.headers.getall("Warning", [])


class ApiClient:
    """``async with ApiClient(api.url, api.token, api.ca_file) as client: ...``."""

    def __init__(self, url: str, token: str | None, ca_file: Path | None = None) -> None:
        self.url = url
        self.token = token
        self._ssl: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(ca_file)) if ca_file else False)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ApiClient:
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, token: str | None, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        chosen = self.token if token is None else token
        if chosen:
            headers["Authorization"] = f"Bearer {chosen}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(self, method: str, target: str, *, body: Any = None,
                      params: Mapping[str, str] | None = None, content_type: str | None = None,
                      token: str | None = None) -> Reply:
        assert self._session is not None, "use ApiClient as an async context manager"
        data = json.dumps(body) if body is not None else None
        kind = content_type or ("application/json" if data is not None else None)
        async with self._session.request(method, self.url + target, data=data, ssl=self._ssl,
                                         params=dict(params or {}),
                                         headers=self._headers(token, kind)) as response:
            text = await response.text()
            try:
                parsed: Any = json.loads(text) if text else None
            except ValueError:
                parsed = text
            return Reply(response.status, parsed, response.headers)

    async def get(self, target: str, **params: str) -> Reply:
        return await self.request("GET", target, params=params)

    async def create(self, target: str, body: Any, **params: str) -> Reply:
        return await self.request("POST", target, body=body, params=params)

    async def update(self, target: str, body: Any, **params: str) -> Reply:
        return await self.request("PUT", target, body=body, params=params)

    async def patch(self, target: str, body: Any,
                    content_type: str = "application/merge-patch+json") -> Reply:
        return await self.request("PATCH", target, body=body, content_type=content_type)

    async def delete(self, target: str, body: Any = None, **params: str) -> Reply:
        return await self.request("DELETE", target, body=body, params=params)

    async def watch(self, target: str, **params: str) -> AsyncIterator[dict[str, Any]]:
        """Each event of a watch until the server ends it (or the caller stops iterating)."""
        assert self._session is not None, "use ApiClient as an async context manager"
        query = {"watch": "true", **params}
        async with self._session.get(self.url + target, params=query, ssl=self._ssl,
                                     headers=self._headers(None, None),
                                     timeout=aiohttp.ClientTimeout(total=None)) as response:
            if response.status != 200:
                yield {"type": "HTTP", "status": response.status, "object": await response.json()}
                return
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)
