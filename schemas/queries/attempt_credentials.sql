-- Attempt credentials: the secret per target a consumer app signs its attempt events with
-- (schemas/attempt_credentials.py, engine/control/attempt_credentials.py).
-- :now is NULL in production (the database's clock rules), a fixed instant in tests.

-- name: insert_attempt_credential
INSERT INTO attempt_credentials (credential_id, target, secret, created_at)
VALUES (:credential_id, :target, :secret, coalesce(:now::timestamptz, now()))
RETURNING credential_id, target, created_at, revoked_at;

-- name: expire_attempt_credentials
-- A rotation: every credential of :target still valid at :until (other than the new one) stops being
-- accepted at :until, so events signed before the rollout finished are still applied meanwhile.
UPDATE attempt_credentials
SET revoked_at = :until
WHERE target = :target AND credential_id <> :keep AND (revoked_at IS NULL OR revoked_at > :until)
RETURNING credential_id;

-- name: revoke_attempt_credential
-- Ends one credential now (or keeps an earlier end); returns nothing if there is no such credential.
UPDATE attempt_credentials
SET revoked_at = least(coalesce(revoked_at, 'infinity'), coalesce(:now::timestamptz, now()))
WHERE credential_id = :credential_id
RETURNING credential_id, target, created_at, revoked_at;

-- name: list_attempt_credentials
-- The credentials of :target (never their secrets), newest first.
SELECT credential_id, target, created_at, revoked_at
FROM attempt_credentials
WHERE target = :target
ORDER BY created_at DESC, credential_id;

-- name: batch_credentials
-- What verifying a batch of attempt events needs once its occurrences are locked (their targets known): each of
-- :targets that has ever had a credential (kind 'enforced': then every event about it must be signed), and the
-- credentials :credential_ids the events claim (kind 'claimed', whatever their target: a claim of another
-- target's credential is refused by name). A claimed id without a row is unknown.
SELECT 'enforced' AS kind, t.target, NULL::uuid AS credential_id, NULL::bytea AS secret,
       NULL::timestamptz AS revoked_at
FROM unnest(:targets::text[]) AS t (target)
WHERE EXISTS (SELECT 1 FROM attempt_credentials a WHERE a.target = t.target)
UNION ALL
SELECT 'claimed', c.target, c.credential_id, c.secret, c.revoked_at
FROM attempt_credentials c
WHERE c.credential_id = ANY (:credential_ids::uuid[]);
