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

-- name: attempt_authorities
-- What verifying a batch of attempt events needs, one row per event that is about an existing occurrence
-- (position :ordinal in the batch, from 1): the occurrence's target, whether that target has ever had a
-- credential (then every event must be signed), and the claimed credential (NULL: unsigned) if it exists.
SELECT e.ordinal, o.target,
       EXISTS (SELECT 1 FROM attempt_credentials a WHERE a.target = o.target) AS enforced,
       c.target AS credential_target, c.secret, c.revoked_at
FROM unnest(:occurrence_ids::uuid[], :credential_ids::uuid[]) WITH ORDINALITY AS e (occurrence_id, credential_id, ordinal)
JOIN occurrences o ON o.occurrence_id = e.occurrence_id
LEFT JOIN attempt_credentials c ON c.credential_id = e.credential_id;

-- name: attempt_authorities_of_days
-- attempt_authorities in the days :days the events name (their occurrences' scheduled_for): one partition's
-- key per event instead of every day's. An event whose occurrence is not found here (a wrong or absent
-- instant) must be looked up again with attempt_authorities: "not found" would let it pass unchecked.
SELECT e.ordinal, o.target,
       EXISTS (SELECT 1 FROM attempt_credentials a WHERE a.target = o.target) AS enforced,
       c.target AS credential_target, c.secret, c.revoked_at
FROM unnest(:occurrence_ids::uuid[], :credential_ids::uuid[]) WITH ORDINALITY AS e (occurrence_id, credential_id, ordinal)
JOIN occurrences o ON o.occurrence_id = e.occurrence_id AND o.scheduled_for = ANY (:days::timestamptz[])
LEFT JOIN attempt_credentials c ON c.credential_id = e.credential_id;
