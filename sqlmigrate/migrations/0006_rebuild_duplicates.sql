-- expand: A rebuild counts apart the replayed records that the consumer acked as
-- duplicates (the live consumer applied them after the reset) from those it
-- applied.
ALTER TABLE catalog.projection_rebuilds
    ADD COLUMN duplicates bigint NOT NULL DEFAULT 0;
