-- Behind a pooler in transaction mode (docs/postgres.md): the limits every AWP session
-- carries (connect.py: SessionLimits) cannot be set per connection there, so they must
-- come from the backends' role.

-- name: looser_limits
-- The settings among $1 (names) that are off, or looser than $2 (the most, in ms, each),
-- on this backend; with the statement that sets each for the role in this database, as
-- an administrator would run it (it applies to sessions opened after it).
SELECT s.name, s.setting || coalesce(s.unit, '') AS setting,
       format('ALTER ROLE %I IN DATABASE %I SET %s = %L',
              current_user, current_database(), w.name, w.ms || 'ms') AS fix
  FROM unnest($1::text[], $2::bigint[]) AS w (name, ms)
  JOIN pg_settings s ON s.name = w.name
 WHERE s.setting::bigint = 0 OR s.setting::bigint > w.ms
 ORDER BY w.name

-- name: backend_pid
-- Which backend ran this statement: a session keeps one for its whole life
-- (pooler.transaction_pooled).
SELECT pg_backend_pid()
