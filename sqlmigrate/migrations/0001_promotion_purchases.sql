-- expand: The PromotionPurchase aggregate of the promotion context.
CREATE SCHEMA IF NOT EXISTS promotion;

CREATE TABLE promotion.promotion_purchases (
    id             uuid PRIMARY KEY,
    tenant_id      uuid        NOT NULL,
    package_kind   text        NOT NULL,
    targets        jsonb       NOT NULL,
    boost_weight   integer     NOT NULL CHECK (boost_weight BETWEEN 1 AND 100),
    status         text        NOT NULL CHECK (status IN ('Pending', 'Active', 'Expired', 'Cancelled')),
    payment_status text        NOT NULL,
    starts_at      timestamptz NOT NULL,
    ends_at        timestamptz NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    version        bigint      NOT NULL CHECK (version >= 1)
);

-- The expirer's scan: Active purchases in EndsAt order.
CREATE INDEX promotion_purchases_due_idx
    ON promotion.promotion_purchases (ends_at) WHERE status = 'Active';

-- The API's listing: one tenant's purchases, newest first.
CREATE INDEX promotion_purchases_tenant_idx
    ON promotion.promotion_purchases (tenant_id, created_at DESC);

-- Idempotency-Key of POST /promotions, per tenant.
CREATE TABLE promotion.idempotency_keys (
    tenant_id    uuid        NOT NULL,
    key          text        NOT NULL,
    request_hash bytea       NOT NULL,
    purchase_id  uuid        NOT NULL REFERENCES promotion.promotion_purchases (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
