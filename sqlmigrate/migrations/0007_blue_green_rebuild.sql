-- expand: A rebuild builds the new projection beside the live one and switches to it
-- in one transaction (router/rebuild): its row names the phase it is in and
-- what it built. The columns applied and duplicates counted records replayed
-- through the consumer by the rebuilds before; they stay for the rows those
-- wrote, and rebuilds leave them 0.
ALTER TABLE catalog.projection_rebuilds
    ADD COLUMN phase         text   NOT NULL DEFAULT ''
        CHECK (phase IN ('', 'read', 'load', 'compute', 'catch-up', 'switch')),
    ADD COLUMN purchases     bigint NOT NULL DEFAULT 0,
    ADD COLUMN contributions bigint NOT NULL DEFAULT 0,
    ADD COLUMN cards_changed bigint NOT NULL DEFAULT 0,
    ADD COLUMN catch_ups     bigint NOT NULL DEFAULT 0;
