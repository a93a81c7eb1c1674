-- A run directory is plain Parquet: read it with DuckDB without converting anything.
--   duckdb -c ".read examples/sql/acceptance_by_position.sql"     (after `svt collect ... --out runs/demo`)
-- Read runs that `svt inspect` reports complete; the glob takes only committed shards (part-*.parquet;
-- shards are written under temporary names and renamed).
SELECT position,
       count(*)                                   AS proposed,
       count(label)                               AS verified,
       sum(CASE WHEN label = 1 THEN 1 ELSE 0 END) AS accepted,
       accepted / verified                        AS conditional,
       accepted / proposed                        AS marginal
FROM read_parquet('runs/demo/drafts/part-*.parquet')
GROUP BY position
ORDER BY position;
