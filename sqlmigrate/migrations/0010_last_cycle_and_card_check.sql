-- expand: What `promoflow status` reads when no process answers it: the expirer's last
-- cycle and the catalog's last card check, each one row that the newest run
-- overwrites (an upsert, so the tables never grow).

-- Every expirer cycle of any promotion process ends by writing here. Its
-- interval is the writer's EXPIRE_INTERVAL: the status calls the expirer
-- stalled past two of them, as PromotionExpireJobStalled does.
CREATE TABLE promotion.expirer_last_cycle (
    singleton     boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    run_id        uuid        NOT NULL,
    as_of         timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL,
    interval_ms   bigint      NOT NULL,
    expired_count integer     NOT NULL,
    poison_count  integer     NOT NULL,
    backlog       integer     NOT NULL,
    duration_ms   bigint      NOT NULL,
    error         text        NOT NULL DEFAULT '',
    -- last_ok_at is the end of the newest cycle that did not fail.
    last_ok_at    timestamptz
);

-- The catalog's periodic card check (CATALOG_AUDIT_INTERVAL) and
-- `promoflow audit` write their outcome here: drift left after any repair,
-- and the first drifted cards. catalog_promotion_drift_cards is the same
-- figure in the process that checked.
CREATE TABLE catalog.card_check (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    checked_at timestamptz NOT NULL,
    checked    bigint      NOT NULL,
    drifted    integer     NOT NULL,
    samples    jsonb       NOT NULL DEFAULT '[]',
    source     text        NOT NULL
);
