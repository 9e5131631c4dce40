-- Every node of docker-compose.citus.yml, when its data directory is made (the image's
-- /docker-entrypoint-initdb.d): Citus and pgvector in the database earm uses, as
-- service.testing.citus does on each node before the coordinator registers the workers.
CREATE EXTENSION IF NOT EXISTS citus;
CREATE EXTENSION IF NOT EXISTS vector;
