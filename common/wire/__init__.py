"""The wire: what crosses a service boundary, and the loops that move it.

- ``schema``: every message type with its body fields and arrays (docs/protocol.md is the authority).
- ``codec``: Message, Limits, ProtocolError and the encoder; ``decoder``: the only decoder;
  ``inserts``: the insert fast path (InsertEncoder and the receiver's shortcut).
- ``transport``: sockets (linger, bounded queues, heartbeats, CurveZMQ) and the fast send/receive.
- ``server``: the ROUTER request loop every service runs.
- ``connection``: the one client-side loop (a DEALER per server, reply matching, handshake events).
- ``errors``: CommTimeout, RemoteError, RequestError.
"""
