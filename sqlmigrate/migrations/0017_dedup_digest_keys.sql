-- expand: adds catalog.processed_records, the consumer's dedup marks keyed by
-- digests; catalog.processed_messages stays as it is, and the previous release
-- runs on unchanged.
--
-- A mark is (sha256 of the dedup key catalog-promotion:purchase-changed:{MessageId},
-- sha256 of the record's payload): 64 bytes whatever the MessageId, where a
-- key of about 2.7 KB or more failed the primary key's insert (54000, index
-- row too large) and held its partition for ever. A redelivery of the same
-- record (same MessageId, same bytes) is a duplicate. A MessageId that comes
-- back with other bytes is a new record: the version guard decides it, and
-- catalog_promotion_message_id_reused_total counts it. The primary key's
-- leading column answers "this MessageId with another payload" too, so one
-- index serves both.
--
-- The previous format, processed_messages.key = the dedup key itself, keeps
-- deduplicating in both directions while both releases run and for as long as
-- its rows are kept (CATALOG_DEDUP_RETENTION):
--   * this release writes, in the same statement and transaction as the
--     digest mark, the previous format's key of every new record whose
--     MessageId is 1..256 bytes of UTF-8 without NUL (every MessageId the relay
--     writes: a UUID). The previous release finds it and acks the record as a
--     duplicate; a record both releases take at once waits on that key's
--     primary-key lock, as two deliveries did before.
--   * a record that is new here and whose previous-format key is already
--     there was applied under the old key (by the previous release, or before
--     the upgrade): it is a duplicate, unless a digest mark of the same
--     MessageId with another payload shows that this release wrote the key
--     (a reused MessageId). A longer MessageId is looked up in the previous
--     format without being written there. A MessageId that the previous
--     release applied and that comes back with other bytes is a duplicate,
--     as the previous release would have it: its key holds no payload.
--   * what the previous release cannot do: store a MessageId of about 2.7 KB
--     or more. While it runs, such a record on one of its partitions stalls
--     there as before, until the partition moves to this release.
-- The dedup janitor deletes past their retention the marks of both tables.
-- The release after this one stops writing the previous format, and a contract
-- migration after the retention drops catalog.processed_messages.
CREATE TABLE catalog.processed_records (
    message_id_digest bytea       NOT NULL,
    payload_digest    bytea       NOT NULL,
    processed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id_digest, payload_digest)
);

CREATE INDEX processed_records_processed_at_idx
    ON catalog.processed_records (processed_at);
