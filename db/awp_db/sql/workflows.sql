-- name: insert
-- Returns nothing when (name, version) already exists.
INSERT INTO workflows (name, version, definition, definition_hash)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name, version) DO NOTHING
RETURNING id, definition, definition_hash, created_at

-- name: get
SELECT id, name, version, definition, definition_hash, created_at
  FROM workflows WHERE name = $1 AND version = $2

-- name: get_latest
SELECT id, name, version, definition, definition_hash, created_at
  FROM workflows WHERE name = $1
 ORDER BY version DESC LIMIT 1

-- name: list
-- Keyset paging on (name, version).
SELECT id, name, version, definition, definition_hash, created_at
  FROM workflows
 WHERE ($1::text IS NULL OR name = $1)
   AND (name, version) > ($2::text, $3::int)
 ORDER BY name, version
 LIMIT $4
