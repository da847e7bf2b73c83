-- expand: adds promotion.relay_topic_partitions, which the previous release does not read.
-- The partition count each topic the relay publishes to had when the relay first
-- saw it. The relay hashes a record's key over this count, not over the topic's
-- current one, so that a key stays in its partition when partitions are added,
-- and it stops publishing while the topic has another count
-- (docs/runbooks/purchase-topic-changed.md).
CREATE TABLE IF NOT EXISTS promotion.relay_topic_partitions (
    topic       text PRIMARY KEY,
    partitions  integer NOT NULL CHECK (partitions > 0),
    recorded_at timestamptz NOT NULL DEFAULT now()
);
