-- expand: adds a column with a default to the migrations table; the previous release's inserts there leave it out and get the default.
-- Each applied migration records the oldest release that runs on the schema
-- once it is applied (its header's compatible_from). A release refuses to start
-- on a schema whose greatest compatible_from is above its own version
-- (sqlmigrate.Check). The rows applied before this column existed were all
-- expand migrations, which 0.1.0 runs on.
ALTER TABLE public.promoflow_migrations
    ADD COLUMN IF NOT EXISTS compatible_from text NOT NULL DEFAULT '0.1.0';
