"""The errors of the wire that callers catch: a timeout, a refusal by the server, a refused request.

:class:`rlfleet.common.wire.codec.ProtocolError` (a message that does not decode) lives
with the decoder, beside the list of its reasons.
"""

from __future__ import annotations


class CommTimeout(TimeoutError):
    """A blocking socket operation did not complete within its timeout."""


class RequestError(Exception):
    """A well-formed request that cannot be served; becomes an ``error`` reply."""

    def __init__(self, reason: str, detail: str, *, count: bool = True) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.count = count  # counted in rlfleet_protocol_errors_total (not a service's own trouble)


class RemoteError(Exception):
    """The server answered a request with an ``error`` message."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
