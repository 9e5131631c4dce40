-- Make the coordinator of docker-compose.citus.yml a Citus cluster with its two workers, as
-- CitusCluster.make_citus (service/testing/citus.py) does for the tests: the coordinator's own
-- host, then each worker. Run by the citus-setup service (psql -v password=...) once every node
-- is up with Citus and pgvector in its database (init-node.sql); every step is a no-op when
-- done already. `earm migrate` then distributes earm's schema (service/db/citus.py).

SELECT citus_set_coordinator_host('citus-coordinator', 5432);
-- How the nodes log into one another: the same role and password everywhere (nodeid 0: any).
INSERT INTO pg_dist_authinfo (nodeid, rolename, authinfo)
VALUES (0, current_user, 'password=' || :'password')
ON CONFLICT DO NOTHING;
SELECT citus_add_node('citus-worker-1', 5432);
SELECT citus_add_node('citus-worker-2', 5432);
