-- expand: The relay's horizon and its position guard (docs/architecture.md, "The relay's
-- horizon" and "The relay position").
--
-- watermill-sql relays the outbox rows of transactions below the snapshot's
-- xmin: the oldest transaction running anywhere on the server, in any database,
-- holds every event back. Here only a transaction that writes the outbox does.
--
-- 1. Every outbox writer takes a shared transaction-level advisory lock (the
--    "writer lock", key (1885760631, 1): two int4 keys, never equal to the
--    catalog's 64-bit keys) before its transaction has an id, and only such a
--    transaction may insert an outbox row (the trigger below).
-- 2. The relay reads rows below outbox_relay_horizon(its snapshot): the smallest
--    id among the snapshot's running transactions that are writers (they hold
--    the writer lock now) or that have ended since the snapshot was taken; the
--    snapshot's xmax when there is none. A transaction that ended after the
--    snapshot may have written rows the snapshot cannot see, so it holds the
--    horizon for this one read; a running transaction that does not hold the
--    writer lock took no id after it (rule 1), so it never writes the outbox.
--    The writers are read before the ended transactions: a writer releases its
--    lock only after it ends, so one missed among the writers is found ended.

CREATE FUNCTION promotion.outbox_writer_lock() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'the outbox writer lock must be the first thing an outbox writer takes: this transaction already has an id'
            USING ERRCODE = '55000';
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1885760631, 1);
    PERFORM set_config('promotion.outbox_writer', 'on', true);
END $$;

CREATE FUNCTION promotion.outbox_check_writer() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('promotion.outbox_writer', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'an outbox row may only be written by a transaction that began with promotion.outbox_writer_lock()'
            USING ERRCODE = '55000';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER outbox_messages_writer_lock
    BEFORE INSERT ON promotion.outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION promotion.outbox_check_writer();

-- The transactions that hold the writer lock in this database now: one row per
-- lock (pid is NULL for a prepared transaction).
CREATE VIEW promotion.outbox_writers AS
SELECT l.pid, l.virtualtransaction, l.granted, a.application_name, a.state, a.xact_start, a.backend_xid
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = 1885760631 AND l.objid = 1 AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());

CREATE FUNCTION promotion.outbox_relay_horizon(snap pg_snapshot) RETURNS xid8
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    writers bigint[]; -- the writers' ids, 32-bit as pg_locks and pg_stat_activity give them
    horizon xid8;
BEGIN
    IF pg_snapshot_xmin(snap) = pg_snapshot_xmax(snap) THEN
        RETURN pg_snapshot_xmax(snap); -- nothing ran when the snapshot was taken
    END IF;
    -- The writers first. Both sources: pg_locks names a prepared writer's id,
    -- pg_stat_activity a writer whose id is newer than its lock on that id.
    WITH l AS MATERIALIZED (
        SELECT locktype, database, classid, objid, objsubid, virtualtransaction, pid, transactionid, granted
        FROM pg_locks
    ), w AS (
        SELECT virtualtransaction, pid FROM l
        WHERE locktype = 'advisory' AND classid = 1885760631 AND objid = 1 AND objsubid = 2
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    )
    SELECT array_agg(x::text::bigint) INTO writers FROM (
        SELECT t.transactionid AS x FROM w
        JOIN l t ON t.virtualtransaction = w.virtualtransaction AND t.locktype = 'transactionid' AND t.granted
        UNION ALL
        SELECT a.backend_xid FROM w JOIN pg_stat_activity a ON a.pid = w.pid WHERE a.backend_xid IS NOT NULL
    ) ids;
    -- Then the snapshot's running transactions that are writers or have ended.
    SELECT min(x) INTO horizon FROM pg_snapshot_xip(snap) AS x
    WHERE (x::text::bigint % 4294967296) = ANY (coalesce(writers, '{}'))
       OR pg_xact_status(x) IS DISTINCT FROM 'in progress';
    RETURN coalesce(horizon, pg_snapshot_xmax(snap));
END $$;

-- The position guard: the relay that takes the position from a holder whose
-- transaction did not commit (its session was cut, its process died, it
-- rolled back) waits takeover_wait seconds before it reads, so that whatever
-- that holder may still send to Kafka within its lease lands first. The
-- sequence holds the id of the position's last holder; sequences are not
-- transactional, so it outlives an aborted holder.
CREATE SEQUENCE promotion.outbox_relay_holder MINVALUE 0 START 0;

CREATE FUNCTION promotion.outbox_relay_position(group_name text, takeover_wait double precision)
RETURNS TABLE (offset_acked bigint, last_processed_transaction_id xid8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    mine bigint;
    previous bigint;
    status text;
BEGIN
    RETURN QUERY SELECT o.offset_acked, o.last_processed_transaction_id FROM promotion.outbox_offsets o
        WHERE o.consumer_group = group_name FOR UPDATE;
    mine := pg_current_xact_id()::text::bigint;
    SELECT last_value INTO previous FROM promotion.outbox_relay_holder;
    PERFORM setval('promotion.outbox_relay_holder', mine);
    IF previous > 0 AND previous < mine THEN
        status := pg_xact_status(previous::text::xid8); -- NULL: too old to matter
        IF status IS NOT NULL AND status <> 'committed' THEN
            PERFORM pg_sleep(takeover_wait);
        END IF;
    END IF;
END $$;
