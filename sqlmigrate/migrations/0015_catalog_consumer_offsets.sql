-- expand: adds a table that the previous release does not read.
-- The Promotion Boost consumer's position, kept with the projection it
-- describes: each partition's next offset, written by the consumer's group
-- commit in the same transaction as the replica, the card boosts and the
-- dedup marks (middleware/offsets.go). A failover to a standby that missed
-- the last commits, or a restore, brings back the offsets that match what
-- the database holds, and the consumer seeks there when it is assigned the
-- partition, before Kafka's committed offset, which may be ahead.
-- Each of the group commit's workers (slot 0, 1, ...; -1: a session's
-- cleanup) writes rows of its own, so that two transactions never wait for
-- each other's commit on a partition's row; a partition's offset is the
-- highest of its rows.
CREATE TABLE catalog.consumer_offsets (
    topic       text        NOT NULL,
    partition   integer     NOT NULL CHECK (partition >= 0),
    slot        smallint    NOT NULL CHECK (slot >= -1),
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, slot)
);
