-- expand: A record whose row PostgreSQL refuses (a value out of its range) is left
-- out of a rebuild and counted, rather than failing it: on a compacted topic
-- the record stays for ever. refused counts them; refused_records names the
-- first ten by partition and offset, with the SQLSTATE and PostgreSQL's
-- message.
ALTER TABLE catalog.projection_rebuilds
    ADD COLUMN refused         bigint NOT NULL DEFAULT 0,
    ADD COLUMN refused_records jsonb  NOT NULL DEFAULT '[]';
