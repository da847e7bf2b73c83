-- expand: The catalog context: storefront cards (fed by chessboard), the replica of
-- promotion contributions and the Promotion Boost consumer's dedup marks.
CREATE SCHEMA IF NOT EXISTS catalog;

-- promotion_boost is written only by handlers/boost; every other column comes
-- from chessboard and the boost consumer never writes it (INV-1).
CREATE TABLE catalog.project_cards (
    id                         uuid PRIMARY KEY,
    title                      text        NOT NULL DEFAULT '',
    status                     text        NOT NULL,
    visibility                 text        NOT NULL,
    min_price                  numeric,
    property_objects_available integer     NOT NULL DEFAULT 0,
    payback                    numeric,
    promotion_boost            integer     NOT NULL DEFAULT 0,
    updated_at                 timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE catalog.property_object_cards (
    id              uuid PRIMARY KEY,
    project_id      uuid        NOT NULL,
    published       boolean     NOT NULL,
    status          text        NOT NULL,
    price           numeric,
    promotion_boost integer     NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The project cascade: a project's (published) objects.
CREATE INDEX property_object_cards_project_idx
    ON catalog.property_object_cards (project_id);

-- One contribution per purchase and target. A card's boost is the sum of the
-- active contributions that address it.
CREATE TABLE catalog.promotion_contributions (
    purchase_id  uuid        NOT NULL,
    target_kind  text        NOT NULL CHECK (target_kind IN ('Project', 'PropertyObject')),
    target_id    uuid        NOT NULL,
    boost_weight integer     NOT NULL CHECK (boost_weight BETWEEN 1 AND 100),
    status       text        NOT NULL CHECK (status IN ('Pending', 'Active', 'Expired', 'Cancelled')),
    version      bigint      NOT NULL CHECK (version >= 1),
    active       boolean     NOT NULL,
    ends_at      timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (purchase_id, target_kind, target_id),
    CONSTRAINT promotion_contributions_active_iff_active_status CHECK (active = (status = 'Active'))
);

-- The recompute's sums. INCLUDE lets them run as index-only scans.
CREATE INDEX promotion_contributions_target_idx
    ON catalog.promotion_contributions (target_kind, target_id) INCLUDE (boost_weight)
    WHERE active;

-- Dedup marks of the consumer, keys catalog-promotion:purchase-changed:{MessageId},
-- written in the same transaction as the state change.
CREATE TABLE catalog.processed_messages (
    key          text PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);
