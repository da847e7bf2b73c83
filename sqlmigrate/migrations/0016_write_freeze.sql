-- expand: adds the promotion context's write freeze (a table and a function);
-- the previous release neither reads nor writes them, and runs on unchanged.
--
-- `promoflow outbox drain` sets the freeze before a cutover (an upgrade by
-- logical replication, a move to another cluster): every outbox writer of
-- every copy (the purchase API, the expirer) then refuses to begin, the relay
-- publishes what is left, and the outbox runs empty. `promoflow outbox thaw`
-- lifts it. An operator's default_transaction_read_only=on is honoured the
-- same way: lib/pq begins every transaction READ WRITE, which overrides it.

-- At most one row (id is always true): the freeze in force.
CREATE TABLE promotion.write_freeze (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),
    frozen_at   timestamptz NOT NULL DEFAULT now(),
    frozen_by   text        NOT NULL DEFAULT current_setting('application_name')
);

-- Refuses an outbox writer while writes are frozen: SQLSTATE 25006
-- (read_only_sql_transaction), which a caller treats as "the database takes
-- no writes now, retry later". Writers call it in the statement that takes
-- the outbox writer lock, after the lock: `promoflow outbox drain` sets the
-- freeze and then waits for the lock's writers to end, and a writer that
-- queued behind it reads the freeze with a snapshot of its own (VOLATILE).
CREATE FUNCTION promotion.outbox_writable() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    since timestamptz;
BEGIN
    IF current_setting('default_transaction_read_only')::boolean THEN
        RAISE EXCEPTION 'promotion writes are refused: default_transaction_read_only is on'
            USING ERRCODE = '25006', HINT = 'set default_transaction_read_only to off when the maintenance ends';
    END IF;
    SELECT frozen_at INTO since FROM promotion.write_freeze;
    IF FOUND THEN
        RAISE EXCEPTION 'promotion writes are frozen since % (promoflow outbox drain)', since
            USING ERRCODE = '25006', HINT = 'promoflow outbox thaw lifts the freeze';
    END IF;
END $$;
