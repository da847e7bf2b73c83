-- expand: adds a table that the previous release neither reads nor writes.
--
-- The DLQ replay's ledger: one row per dead letter's first origin (the topic,
-- partition and offset where the record first failed, which its
-- x-source-topic, x-original-partition and x-original-offset headers carry
-- unchanged across replays). `promoflow dlq-replay` writes a row once the
-- replay topic acknowledged the record, and skips a dead letter whose origin
-- has a row, whatever consumer group the run uses: without it each new group
-- replayed the whole DLQ again, copies included. --force replays anyway and
-- counts it here.
CREATE TABLE catalog.dlq_replays (
    source_topic      text        NOT NULL,
    source_partition  integer     NOT NULL CHECK (source_partition >= 0),
    source_offset     bigint      NOT NULL CHECK (source_offset >= 0),
    replays           integer     NOT NULL DEFAULT 1 CHECK (replays >= 1),
    first_replayed_at timestamptz NOT NULL DEFAULT now(),
    last_replayed_at  timestamptz NOT NULL DEFAULT now(),
    last_group        text        NOT NULL,
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
