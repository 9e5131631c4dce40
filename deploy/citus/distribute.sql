-- Distribute earm's schema across the Citus workers, once `earm migrate` has created it on the
-- coordinator (as local tables). Run by the citus-distribute service of docker-compose.citus.yml;
-- it does nothing on a second run. docs/sharding.md ("Citus") says why each table goes where.
--
-- Every table of a namespace's data is distributed by its namespace and co-located with
-- `namespaces`, so one namespace's rows of every table sit in one shard group, on one worker,
-- and a statement that names the namespace is routed there. The locators are distributed by
-- id: a by-id route reads one shard of them. Keys and settings are reference tables, on every
-- node. Foreign keys are dropped while the tables move and added back after (Citus checks a
-- key between distributed tables only once both are distributed and co-located); the
-- locators' keys to the rows cannot be kept, as they cross distribution columns: earm deletes
-- locator rows in the statement that deletes their row, so nothing needs them.

DO $$
DECLARE
    keys CONSTANT text[][] := ARRAY[
        ['memories', 'fk_memories_namespace_namespaces',
         'FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE'],
        ['queries', 'fk_queries_namespace_namespaces',
         'FOREIGN KEY (namespace) REFERENCES namespaces (name) ON DELETE CASCADE'],
        ['scores', 'fk_scores_query_id_queries',
         'FOREIGN KEY (namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE'],
        ['scores', 'fk_scores_memory_id_memories',
         'FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE'],
        ['score_history', 'fk_score_history_query_id_queries',
         'FOREIGN KEY (namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE'],
        ['score_history', 'fk_score_history_memory_id_memories',
         'FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE'],
        ['memory_factors', 'fk_memory_factors_memory_id_memories',
         'FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE'],
        ['query_factors', 'fk_query_factors_query_id_queries',
         'FOREIGN KEY (namespace, query_id) REFERENCES queries (namespace, id) ON DELETE CASCADE'],
        ['rerank_documents', 'fk_rerank_documents_memory_id_memories',
         'FOREIGN KEY (namespace, memory_id) REFERENCES memories (namespace, id) ON DELETE CASCADE']
    ];
    tables CONSTANT text[] := ARRAY[
        'memories', 'queries', 'scores', 'score_history', 'memory_factors', 'query_factors',
        'rerank_documents'
    ];
    item text[];
    name text;
BEGIN
    IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'namespaces'::regclass) THEN
        RAISE NOTICE 'earm''s tables are distributed already';
        RETURN;
    END IF;
    ALTER TABLE memory_locator DROP CONSTRAINT fk_memory_locator_namespace_memories;
    ALTER TABLE query_locator DROP CONSTRAINT fk_query_locator_namespace_queries;
    FOREACH item SLICE 1 IN ARRAY keys LOOP
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', item[1], item[2]);
    END LOOP;
    PERFORM create_reference_table('api_keys');
    PERFORM create_reference_table('auth_settings');
    PERFORM create_distributed_table('namespaces', 'name');
    FOREACH name IN ARRAY tables LOOP
        PERFORM create_distributed_table(name, 'namespace', colocate_with => 'namespaces');
    END LOOP;
    PERFORM create_distributed_table('memory_locator', 'id');
    PERFORM create_distributed_table('query_locator', 'id', colocate_with => 'memory_locator');
    FOREACH item SLICE 1 IN ARRAY keys LOOP
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I %s', item[1], item[2], item[3]);
    END LOOP;
END
$$;
