"""Exactly-once requests (replay inserts, paramserver gradient pushes): which (sender, seq) pairs
are already stored or applied, in bounded memory.

Per sender we keep ``floor`` (every seq <= floor is stored or forgotten on
purpose) and the set of stored seqs above it. The floor advances over
contiguous seqs, and also to ``window_start - 1`` when the sender says so:
every insert of :class:`~rlfleet.common.clients.replay_insert.InsertClient` carries
``window_start``, the lowest seq still un-acked on its side, so seqs below it
will never be resent. The set therefore holds at most the sender's window.
Whether or not the sender says, the set holds at most ``WINDOW`` (4,096) seqs:
only the newest ``WINDOW`` stored seqs are remembered (the floor moves up to
the newest of those dropped), so a sender cannot grow the set without bound
(e.g. with a stale ``window_start``). This is safe for any sender that keeps at
most ``WINDOW`` inserts un-acked with consecutive seqs, which is why the config
caps ``actor.max_unacked`` at 4,096; older seqs would be taken as already
stored. It is a count of stored seqs, not a distance, and ``window_start``
moves the floor no higher than the highest seq stored before the insert that
carries it (a sender has seen acks only of what was stored): one insert far
ahead, with any ``window_start``, moves the floor over none of the seqs the
sender has yet to send (it once moved it 4,096 to 8,192 seqs up, so that the
sender's next inserts were acked as duplicates and never stored).

Senders are kept in order of their last insert. Beyond ``max_senders`` the least recent is
forgotten only if it has been silent for ``idle_s`` (the documented horizon, 10 minutes): a live
sender is never forgotten to make room, so a flood of new sender ids cannot make a live sender's
resend look new and be stored twice. When every sender is live, a new one is refused
(:meth:`refusal`, ``too_many_senders``). Of the senders it forgot, one number is kept, for as
long as the server lives and across restarts (it is in the snapshot and the checkpoint): the
``watermark``, the highest seq any of them had stored. An insert of a sender it does not
remember whose seq is at or below the watermark is refused (``sender_forgotten``) instead of
taken as new, and so is one at or below the watermark of the moment a sender was first seen: a
forgotten sender's resend, at most its highest seq, is never stored twice however many senders
come and go (a list of forgotten names once did that only until it overflowed). Its client
starts over under a new sender id.

Where a sender's seqs start is the server's word, not a clock's: :meth:`first_seq` (in every
``info_reply``, which InsertClient and GradientPusher ask for before their first insert or
push) is the watermark + 1 for a sender it does not remember, and its highest stored seq + 1 for
one it does (a client restarted under its id goes on after its last insert: none of its new
inserts is taken for the old one's resend, whatever the clocks of either host did). They used to
start at the client's wall clock in microseconds, with the watermark capped at the server's: a
clock stepped back made a restarted sender's new inserts duplicates of its old ones (acked, never
stored), and a client whose clock ran behind the server's was refused. A new sender's first seq
must lie above the watermark by at most ``MAX_FIRST_AHEAD`` (2^32): nobody can claim every seq
of a sender before its first insert, and a sender that stored one seq as far ahead as allowed and
was then forgotten moves the watermark by at most that much (clients ask for the watermark, so
none is locked out; the 64-bit seqs last 2^31 such forgettings, each after ``idle_s`` of
silence). Memory: the remembered senders only (``max_senders``, each its floor and at most
``WINDOW`` seqs), and one int.

A known sender's seq more than ``MAX_AHEAD`` (8,192) above its floor, or more than
``MAX_AHEAD`` below it, is refused (``seq_out_of_window``): no client that keeps at most
``WINDOW`` inserts un-acked sends either (a resend is never more than ``WINDOW`` below the
newest seq it sent). Ahead, taking it would move the window past seqs the sender has yet to
send; below, acking it as a duplicate would hide that someone else claimed the sender's seqs
(without CurveZMQ anyone who knows a sender id can): its owner is told, not silently dropped.
After a restart from a snapshot (without a write-ahead log the snapshot may be older than
what the sender has since sent), each restored sender's first insert re-anchors its window
instead.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rlfleet.common.wire.errors import RemoteError

WINDOW = 4096
IDLE_S = 600.0  # a sender silent this long may be forgotten (its later inserts are then refused)
MAX_AHEAD = 2 * WINDOW  # how far above (or below) its floor a known sender's seq may be
MAX_FIRST_AHEAD = 1 << 32  # a new sender's first seq is at most this far above the watermark


def first_seq_of(reply: Any, server: str) -> int:
    """The ``first_seq`` of an ``info_reply`` (what :meth:`Dedup.first_seq` answered the asking sender);
    RemoteError naming ``server`` when the reply holds none."""
    stats = reply.get("stats") if reply.type == "info_reply" else None
    first = stats.get("first_seq") if isinstance(stats, dict) else None
    if type(first) is not int or first < 0:
        raise RemoteError("bad_reply", f"{server} answered info with no first_seq (a server older than this client?);"
                          " a sender's seqs start where the server says")
    return first


class _Sender:
    __slots__ = ("floor", "above", "top", "at", "anchored", "born")

    def __init__(self, floor: int, at: float, anchored: bool = True, born: int = -1) -> None:
        self.floor = floor
        self.above: set[int] = set()
        self.top = floor  # highest seq stored
        self.born = born  # the watermark when it was first seen: its seqs at or below it are refused
        self.at = at  # last insert, on the Dedup's clock
        self.anchored = anchored  # False for a sender restored from a snapshot, until its next insert

    def advance(self, floor: int) -> None:
        if floor > self.floor:
            self.floor = floor
            self.above = {s for s in self.above if s > floor}
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)


class Dedup:
    def __init__(self, max_senders: int = 100_000, window: int = WINDOW, idle_s: float = IDLE_S,
                 service: str = "replay", what: str = "insert", clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.clock = clock  # seconds, for idle_s (tests pass a fake one); seqs never depend on a clock
        self.service = service  # who speaks in the refusals
        self.what = what  # what a sender sends
        self.max_senders = max_senders
        self.window = window
        self.idle_s = idle_s
        self.senders: OrderedDict[str, _Sender] = OrderedDict()
        self.watermark = -1  # the highest seq stored by any sender forgotten (to make room) so far

    def refusal(self, sender: str, seq: int) -> tuple[str, str] | None:
        """Why an insert of ``sender`` with ``seq`` cannot be taken (reason, detail), or None."""
        s = self.senders.get(sender)
        if s is not None and seq <= s.born:
            return self._forgotten(sender, seq)
        if s is not None:
            if s.anchored and not s.floor - MAX_AHEAD <= seq <= s.floor + MAX_AHEAD:
                where = "above" if seq > s.floor else "below"
                return ("seq_out_of_window", f"seq {seq} is more than {MAX_AHEAD} {where} {s.floor}, the highest"
                        f" seq of sender {sender!r} below which all are stored; allowed:"
                        f" {max(0, s.floor - MAX_AHEAD)} to {s.floor + MAX_AHEAD} (a sender keeps at most"
                        f" {self.window} {self.what}s un-acked with consecutive seqs; one far below means another"
                        " client claimed this sender id's seqs)")
            return None
        if seq <= self.watermark:
            return self._forgotten(sender, seq)
        if seq > self.watermark + MAX_FIRST_AHEAD:
            return ("seq_out_of_window", f"seq {seq} is the first of sender {sender!r}; allowed: a first seq"
                    f" from {self.watermark + 1} to {self.watermark + MAX_FIRST_AHEAD} (ask info_reply's"
                    " first_seq)")
        if len(self.senders) < self.max_senders:
            return None
        oldest = next(iter(self.senders.values()))
        if self.clock() - oldest.at >= self.idle_s:
            return None
        return ("too_many_senders", f"{self.service} remembers {self.max_senders} senders and all sent within"
                f" {self.idle_s:.0f} s; try again later")

    def _forgotten(self, sender: str, seq: int) -> tuple[str, str]:
        return ("sender_forgotten", f"{self.service} does not remember sender {sender!r} at seq {seq}: it may have"
                f" forgotten it (after {self.idle_s:.0f} s without a message), so it cannot tell a resend from a new"
                f" {self.what}; allowed: seqs above {self.watermark}, the highest seq of any sender it forgot (send as"
                " a new sender id from the first_seq an info request answers, as InsertClient does)")

    def first_seq(self, sender: str) -> int:
        """Where ``sender``'s seqs should start: after its highest stored seq if it is remembered (a
        client restarted under its id), else above every seq of every sender forgotten so far."""
        s = self.senders.get(sender)
        if s is not None:
            return max(s.top, s.born) + 1
        return max(1, self.watermark + 1)

    def seen(self, sender: str, seq: int) -> bool:
        s = self.senders.get(sender)
        return s is not None and (seq <= s.floor or seq in s.above)

    def add(self, sender: str, seq: int, window_start: int | None = None) -> None:
        s = self.senders.get(sender)
        reanchor = s is None or not s.anchored  # window_start may move a new or restored sender's floor anywhere
        if s is None:
            start = window_start if window_start is not None else seq - self.window
            s = self.senders[sender] = _Sender(min(start, seq) - 1, self.clock(), born=self.watermark)
            while len(self.senders) > self.max_senders:  # only idle ones: the server asks refusal() first
                self.watermark = max(self.watermark, self.senders.popitem(last=False)[1].top)
        else:
            self.senders.move_to_end(sender)
            s.at = self.clock()
            s.anchored = True  # a restored sender's window goes on from here, however far ahead
            if seq == s.floor + 1 and not s.above:
                # the next seq in order (the usual case): nothing above the floor, and window_start
                # cannot pass seq
                s.floor = s.top = seq
                return
        if seq > s.floor:
            s.above.add(seq)
        floor = s.floor
        if window_start is not None:  # else only over seqs up to the highest stored before: never future ones
            floor = max(floor, min(window_start, seq, seq if reanchor else s.top + 1) - 1)
        s.top = max(s.top, seq)
        excess = len(s.above) - self.window
        if excess > 0:  # only the newest WINDOW stored seqs are remembered: the floor passes the others
            floor = max(floor, sorted(s.above)[excess - 1])
        s.advance(floor)

    def __len__(self) -> int:
        return len(self.senders)

    def state(self) -> dict[str, Any]:
        """Each sender's [floor, stored seqs above it, born]: what a snapshot or checkpoint keeps."""
        return {name: [s.floor, sorted(s.above), s.born] for name, s in self.senders.items()}

    def restore(self, state: dict[str, Any], watermark: int = -1) -> None:
        """From :meth:`state` (a state written before ``born`` was kept, [floor, above], restores -1)."""
        self.senders.clear()
        self.watermark = watermark
        for name, (floor, above, *rest) in state.items():
            # born too: a sender restored without it (and not anchored until its next insert) would take a
            # forgotten namesake's resend at or below the watermark as new after every restart
            born = int(rest[0]) if rest else -1
            s = self.senders[name] = _Sender(int(floor), self.clock(), anchored=False, born=born)
            s.above = {int(x) for x in above}
            s.top = max(s.above, default=s.floor)
