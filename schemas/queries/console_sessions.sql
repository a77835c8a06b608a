-- Operator tokens and console sessions (engine/control/operators.py, engine/api/console/sessions.py).
-- :now is NULL in production (the database's clock rules), a fixed instant in tests.

-- name: insert_operator_token
-- Stores a new operator token (its hash only).
INSERT INTO operator_tokens (token_hash, name, created_at) VALUES (:token_hash, :name, coalesce(:now::timestamptz, now()))
RETURNING name, created_at;

-- name: operator_by_token_hash
-- The operator a token belongs to, unless revoked.
SELECT name FROM operator_tokens WHERE token_hash = :token_hash AND revoked_at IS NULL;

-- name: revoke_operator_tokens
-- Revokes every token of an operator name (their console sessions end with them).
UPDATE operator_tokens SET revoked_at = coalesce(:now::timestamptz, now()) WHERE name = :name AND revoked_at IS NULL
RETURNING name;

-- name: insert_console_session
-- Records a console sign-in (the cookie's session id is stored hashed), valid for :ttl_s seconds.
INSERT INTO console_sessions (session_hash, tenant_id, operator, csrf_token, created_at, expires_at)
VALUES (:session_hash, :tenant_id, :operator, :csrf_token, coalesce(:now::timestamptz, now()),
        coalesce(:now::timestamptz, now()) + make_interval(secs => :ttl_s));

-- name: console_session
-- A live console session: not expired, its tenant still active or its operator still holding a token.
SELECT s.tenant_id, s.operator, s.csrf_token, s.expires_at
FROM console_sessions s
LEFT JOIN tenants t ON t.tenant_id = s.tenant_id
WHERE s.session_hash = :session_hash AND s.expires_at > coalesce(:now::timestamptz, now())
  AND (s.tenant_id IS NULL OR t.state = 'active')
  AND (s.operator IS NULL OR EXISTS (
      SELECT 1 FROM operator_tokens o WHERE o.name = s.operator AND o.revoked_at IS NULL));

-- name: delete_console_session
-- Signs a console session out.
DELETE FROM console_sessions WHERE session_hash = :session_hash;

-- name: prune_console_sessions
-- Forgets expired console sessions.
DELETE FROM console_sessions WHERE expires_at <= coalesce(:now::timestamptz, now());
