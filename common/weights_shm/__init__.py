"""Same-host fast path: readers map a version from shared memory instead of receiving it.

With many actors on the paramserver's host, sending every actor its own copy
over loopback tcp costs one kernel copy per actor per version. A reader that
says ``shm: true`` in ``get``/``wait`` instead gets a ``weights`` reply without
payload frames whose ``shm`` field names a file in /dev/shm holding that
version's arrays (written once per version, on first demand, then immutable);
the reader maps it read-only. This is what Ray's object store does for readers
on the same node.

Safety: file names carry the server's pid and a random 128-bit token, are
created with O_EXCL and mode 0600, and a reader maps only paths of the form
``/dev/shm/rlfleet-ps-<name>`` whose size covers every array, opened with
O_NOFOLLOW, and only a regular file owned by the reader's own uid (/dev/shm is
world-writable: anyone could plant a symlink or a file of theirs there). A
file that fails those checks is treated like one the reader cannot see:
frames for that shard. A reader whose
/dev/shm is not the server's (another host or container) cannot open the
probe file named in the reply and falls back to frames for that shard.
A reader holds a shared flock on a file for as long as it maps it (the lock
belongs to the open file, which the mapping keeps open), taken before it
maps and followed by a check that the name still leads to that file.

Pages are recycled rather than allocated and freed per version: on this
kind of host allocating a file's pages and freeing them costs about 1 ms per
MB each, more than the copy itself. When a shard drops a version it retires
the file; once it can take an exclusive flock (no reader maps it any more)
it renames it to a free name and reuses it, or, for a file the publisher
wrote, hands it back in ``publish_ack.free`` for the publisher's next slice.
A file that readers keep mapped stays retired (at most ``MAX_RETIRED``, then
the oldest is unlinked: its pages go when the last reader lets go).

The publisher on the shards' host does the same in the other direction
(:class:`~rlfleet.common.weights_shm.writer.ShmWriter`): it writes each shard's slice once into a file of its
own (``...-pub<n>``, pages allocated ahead of time) and sends only its name;
the shard maps it, checks it like any publish and takes the file over as that
version's file (a rename), so the bytes are copied once from the learner to
every same-host reader, instead of once over tcp to the shard and once more
into /dev/shm.
"""

from rlfleet.common.weights_shm.exporter import ShmExporter
from rlfleet.common.weights_shm.files import PREFIX, SHM_DIR, available, clean_stale, discard, layout_of
from rlfleet.common.weights_shm.mapping import ShmGone, ShmUnavailable, map_arrays, map_published
from rlfleet.common.weights_shm.writer import ShmWriter

__all__ = [
    "PREFIX", "SHM_DIR", "ShmExporter", "ShmGone", "ShmUnavailable", "ShmWriter", "available", "clean_stale",
    "discard", "layout_of", "map_arrays", "map_published",
]
