-- expand: adds a table that the previous release neither reads nor writes.
--
-- An operator's way past a record that the Promotion Boost consumer retries
-- without end (a transient or systemic class that never clears for that one
-- record): `promoflow dlq park --partition P --offset O --reason "..."`
-- writes a request here. A CLI cannot commit a live member's offset, so the
-- consumer that owns the partition reads the request when the record fails
-- again (its next retry), dead-letters that one record with the reason, and
-- goes on. done_at is set once the dead letter is written.
CREATE TABLE catalog.dlq_park_requests (
    topic        text        NOT NULL,
    partition    integer     NOT NULL CHECK (partition >= 0),
    "offset"     bigint      NOT NULL CHECK ("offset" >= 0),
    reason       text        NOT NULL CHECK (reason <> ''),
    requested_at timestamptz NOT NULL DEFAULT now(),
    requested_by text        NOT NULL DEFAULT current_setting('application_name'),
    done_at      timestamptz,
    PRIMARY KEY (topic, partition, "offset")
);
