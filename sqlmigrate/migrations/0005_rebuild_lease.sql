-- expand: One projection rebuild at a time across every process: the one row in state
-- 'running' is the lease, kept fresh by the rebuild's progress writes. (A
-- session advisory lock would stay with whichever server connection a pooler
-- in transaction mode lent at that moment.) Older running rows, if any, are
-- left from stopped processes.
UPDATE catalog.projection_rebuilds
SET state = 'failed', finished_at = now(), error = 'abandoned: its process stopped'
WHERE state = 'running'
  AND id <> (SELECT id FROM catalog.projection_rebuilds WHERE state = 'running' ORDER BY started_at DESC LIMIT 1);

CREATE UNIQUE INDEX projection_rebuilds_one_running
    ON catalog.projection_rebuilds ((true)) WHERE state = 'running';
