-- expand: Every table that grows with traffic has a way to shrink: these indexes serve
-- the janitors that delete dedup marks and idempotency keys past their retention.
CREATE INDEX processed_messages_processed_at_idx
    ON catalog.processed_messages (processed_at);

CREATE INDEX idempotency_keys_created_at_idx
    ON promotion.idempotency_keys (created_at);

-- Projection rebuilds, newest first: any catalog process (or the CLI) that runs
-- one writes its progress here, so every copy of the catalog reports the same.
CREATE TABLE catalog.projection_rebuilds (
    id            uuid PRIMARY KEY,
    state         text        NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    updated_at    timestamptz NOT NULL,
    offsets_done  bigint      NOT NULL DEFAULT 0,
    offsets_total bigint      NOT NULL DEFAULT 0,
    read          bigint      NOT NULL DEFAULT 0,
    applied       bigint      NOT NULL DEFAULT 0,
    skipped       bigint      NOT NULL DEFAULT 0,
    error         text        NOT NULL DEFAULT ''
);

CREATE INDEX projection_rebuilds_started_at_idx
    ON catalog.projection_rebuilds (started_at DESC);
