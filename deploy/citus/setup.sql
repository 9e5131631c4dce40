-- Make the coordinator of docker-compose.citus.yml a Citus cluster with its two workers.
-- Run by the citus-setup service (psql -v password=...); every step is a no-op when done already.

SELECT citus_set_coordinator_host('citus-coordinator', 5432);
-- How the nodes log into one another: the same role and password everywhere (nodeid 0: any).
INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo)
VALUES (0, current_user, 'password=' || :'password')
ON CONFLICT DO NOTHING;
SELECT citus_add_node('citus-worker-1', 5432);
SELECT citus_add_node('citus-worker-2', 5432);
-- earm migrate creates it too; created here, with the workers known, it exists on every node.
CREATE EXTENSION IF NOT EXISTS vector;
