"""Clients of the replay and paramserver services, used by services, tools and benchmarks.

- ``replay_insert``: InsertClient (actors: exactly-once inserts into one shard).
- ``replay_sample``: SampleClient (learner: batches from every shard, priorities back).
- ``weights_publisher``: WeightsPublisher (learner: publish versions, the round barrier).
- ``weights_reader``: WeightsReader (actors, evaluators: one consistent version).
- ``version_probe``: VersionProbe (which versions the shards hold, with ``info``).
- ``registry``: RegistryClient (actors: hello, heartbeat, goodbye).
- ``fleet_links``: FleetLinks (an actor's registry and weights links together).
- ``paramserver_shards``: the connections to every paramserver shard the others share.

All of them talk through :class:`rlfleet.common.wire.connection.Connection`.
"""
