-- expand: adds a table that the previous release neither reads nor writes.
--
-- The record each partition's consumer keeps failing on, written by the
-- consumer's retry (at most every few seconds a partition) so that
-- `promoflow status`, which reads the database and Kafka only, can show a
-- partition whose position has not moved while it has work: its offset,
-- since when, and the last error. A row is current while its offset is not
-- below the partition's stored offset (catalog.consumer_offsets) and its
-- last failure is recent; nothing deletes it, the next stuck record of the
-- partition replaces it.
CREATE TABLE catalog.consumer_failures (
    topic           text        NOT NULL,
    partition       integer     NOT NULL CHECK (partition >= 0),
    "offset"        bigint      NOT NULL CHECK ("offset" >= 0),
    error           text        NOT NULL,
    attempts        integer     NOT NULL,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    PRIMARY KEY (topic, partition)
);
