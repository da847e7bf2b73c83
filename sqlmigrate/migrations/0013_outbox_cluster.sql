-- expand: the outbox knows its cluster (docs/architecture.md, "The relay across a restore").
-- It adds a table, a column, functions and triggers, and gives the functions a
-- previous release calls (the writer lock, the relay's position and horizon)
-- new bodies under the same signatures: that release keeps working on it.
--
-- The relay's position is a transaction id (watermill-sql's layout), and a
-- transaction id means something only on the cluster that assigned it. A
-- database restored into another cluster (pg_dump, a logical-replication
-- upgrade) brings rows and a position from ids far above the ones the new
-- cluster assigns: its rows would sort below the position, never be relayed,
-- and be deleted by the janitor. So:
--
-- 1. promotion.outbox_cluster records the cluster the outbox runs on and an
--    xid shift: every outbox row stores pg_current_xact_id() + shift (the row
--    trigger below), and the relay's horizon is shifted alike. The shift is 0
--    on the cluster where the outbox began.
-- 2. promotion.outbox_xid_shift() resolves it for the transaction: when the
--    recorded system identifier is not this cluster's, or the newest row or
--    the position lies at or above the next id + shift, it re-bases, under the
--    row's lock: shift = newest + 1 - next id (never lower than before), so
--    that every id the cluster assigns from now on sorts above every row and
--    the position. Both the writer lock and the relay's position read resolve
--    it, so whichever comes first after a restore re-bases, and no row of the
--    new cluster is written unshifted.
-- 3. The position row records the cluster it was acked on (a trigger, so
--    that watermill's ack query is unchanged), and the janitor deletes rows
--    at or before the position only when that is this cluster: a position
--    brought from elsewhere proves nothing here until the relay acks here.
--
-- pg_dump creates triggers after it loads the rows, and a logical-replication
-- apply does not fire them: restored and replicated rows keep their ids.

CREATE TABLE promotion.outbox_cluster (
    singleton                  bool PRIMARY KEY DEFAULT true CHECK (singleton),
    system_identifier          bigint NOT NULL,
    xid_shift                  bigint NOT NULL DEFAULT 0 CHECK (xid_shift >= 0),
    rebases                    bigint NOT NULL DEFAULT 0,
    previous_system_identifier bigint,
    rebased_at                 timestamptz
);
INSERT INTO promotion.outbox_cluster (system_identifier) SELECT system_identifier FROM pg_control_system();

-- This cluster's system identifier, kept in the session: a session never
-- changes cluster (a streaming standby keeps its primary's identifier), and
-- pg_control_system() reads a file.
CREATE FUNCTION promotion.outbox_system_identifier() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    here text := nullif(current_setting('promotion.outbox_system_identifier', true), '');
BEGIN
    IF here IS NULL THEN
        SELECT system_identifier::text INTO here FROM pg_control_system();
        PERFORM set_config('promotion.outbox_system_identifier', here, false);
    END IF;
    RETURN here::bigint;
END $$;

CREATE FUNCTION promotion.outbox_xid_shift() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    here bigint := promotion.outbox_system_identifier();
    c promotion.outbox_cluster;
    newest bigint;
    next_xid bigint;
    shift bigint;
BEGIN
    -- First as it stands; then, to re-base, under the row's lock: whoever
    -- else resolves meanwhile waits there, and then finds it done (read
    -- committed) or starts again (repeatable read's 40001).
    FOR locked IN 0..1 LOOP
        IF locked = 0 THEN
            SELECT * INTO c FROM promotion.outbox_cluster;
            IF NOT FOUND THEN
                -- A schema copied without its rows (pg_dump --schema-only
                -- for a logical-replication upgrade): a record of no
                -- cluster, which the re-base below fills in.
                INSERT INTO promotion.outbox_cluster (system_identifier) VALUES (0) ON CONFLICT DO NOTHING;
                CONTINUE;
            END IF;
        ELSE
            SELECT * INTO STRICT c FROM promotion.outbox_cluster FOR UPDATE;
        END IF;
        -- The newest id the outbox holds (a row's or the position's) and the
        -- next id the cluster assigns, from one snapshot: a row it sees was
        -- written by a transaction below that next id.
        SELECT coalesce(greatest(
                (SELECT transaction_id FROM promotion.outbox_messages ORDER BY transaction_id DESC, "offset" DESC LIMIT 1),
                (SELECT max(last_processed_transaction_id) FROM promotion.outbox_offsets))::text::bigint, 0),
            pg_snapshot_xmax(pg_current_snapshot())::text::bigint
        INTO newest, next_xid;
        IF c.system_identifier = here AND newest < next_xid + c.xid_shift THEN
            RETURN c.xid_shift;
        END IF;
    END LOOP;
    shift := greatest(c.xid_shift, newest + 1 - next_xid);
    UPDATE promotion.outbox_cluster SET system_identifier = here, xid_shift = shift,
        previous_system_identifier = c.system_identifier, rebases = c.rebases + 1, rebased_at = now();
    RAISE WARNING 'promotion outbox re-based onto cluster %: transaction ids are shifted by % (was % on cluster %)',
        here, shift, c.xid_shift, c.system_identifier
        USING DETAIL = format('newest outbox id %s, next id of this cluster %s', newest, next_xid),
              HINT = 'expected once after a restore into another cluster or a logical-replication upgrade; see docs/runbooks/outbox-backlog.md';
    RETURN shift;
END $$;

-- The writer lock of 0008, and then the shift for the row trigger. The
-- shift is resolved after the lock: a re-base gives the transaction an id.
ALTER FUNCTION promotion.outbox_writer_lock() RENAME TO outbox_take_writer_lock;

CREATE FUNCTION promotion.outbox_writer_lock() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM promotion.outbox_take_writer_lock();
    PERFORM set_config('promotion.outbox_xid_shift', promotion.outbox_xid_shift()::text, true);
END $$;

-- After the statement trigger of 0008, which refuses a transaction that did
-- not take the writer lock.
CREATE FUNCTION promotion.outbox_shift_xid() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    shift bigint := nullif(current_setting('promotion.outbox_xid_shift', true), '')::bigint;
BEGIN
    IF shift IS NULL THEN
        RAISE EXCEPTION 'an outbox row may only be written by a transaction that began with promotion.outbox_writer_lock()'
            USING ERRCODE = '55000';
    END IF;
    IF shift <> 0 THEN
        NEW.transaction_id := (NEW.transaction_id::text::bigint + shift)::text::xid8;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER outbox_messages_xid_shift
    BEFORE INSERT ON promotion.outbox_messages
    FOR EACH ROW EXECUTE FUNCTION promotion.outbox_shift_xid();

-- The horizon in the rows' space. A shift read before a re-base commits is
-- lower, so the horizon is too: the relay reads less, never past a writer.
ALTER FUNCTION promotion.outbox_relay_horizon(pg_snapshot) RENAME TO outbox_relay_native_horizon;

CREATE FUNCTION promotion.outbox_relay_horizon(snap pg_snapshot) RETURNS xid8
LANGUAGE sql VOLATILE AS $$
    SELECT (promotion.outbox_relay_native_horizon(snap)::text::bigint + c.xid_shift)::text::xid8
    FROM promotion.outbox_cluster c
$$;

-- The position read of 0008, which now also resolves the shift first (a
-- relay that comes first after a restore re-bases) and ends the session of a
-- holder that stays idle in its transaction longer than idle_timeout seconds
-- (a frozen process whose connection stays up would otherwise hold the
-- position for ever). The lock order is the cluster's row, then the position's.
ALTER FUNCTION promotion.outbox_relay_position(text, double precision) RENAME TO outbox_relay_take_position;

CREATE FUNCTION promotion.outbox_relay_position(group_name text, takeover_wait double precision, idle_timeout double precision)
RETURNS TABLE (offset_acked bigint, last_processed_transaction_id xid8)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF idle_timeout > 0 THEN
        PERFORM set_config('idle_in_transaction_session_timeout', ceil(idle_timeout * 1000)::bigint::text, true);
    END IF;
    PERFORM promotion.outbox_xid_shift();
    RETURN QUERY SELECT * FROM promotion.outbox_relay_take_position(group_name, takeover_wait);
END $$;

-- A previous release's relay: its takeover wait is 1.25 times its lease, and
-- its idle limit is twice the lease.
CREATE FUNCTION promotion.outbox_relay_position(group_name text, takeover_wait double precision)
RETURNS TABLE (offset_acked bigint, last_processed_transaction_id xid8)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM promotion.outbox_relay_position(group_name, takeover_wait, takeover_wait * 1.6)
$$;

-- The cluster each position was acked on; NULL for a position acked before
-- this migration, until the relay's next ack.
ALTER TABLE promotion.outbox_offsets ADD COLUMN acked_on_system_identifier bigint;

CREATE FUNCTION promotion.outbox_offsets_acked_on() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.acked_on_system_identifier := promotion.outbox_system_identifier();
    RETURN NEW;
END $$;

CREATE TRIGGER outbox_offsets_acked_on
    BEFORE INSERT OR UPDATE ON promotion.outbox_offsets
    FOR EACH ROW EXECUTE FUNCTION promotion.outbox_offsets_acked_on();
