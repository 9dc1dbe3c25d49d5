-- The fencelock write guard in a protected service's own MySQL (8.0 or later) or MariaDB
-- (10.5 or later) database: the current one. A service in any language protects a write by
-- one call in the write's own transaction, before the write:
--
--     CALL fencelock_guard_admit(key, token);
--
-- It admits the token's fence when that fence is >= the highest admitted for `key` (and
-- records it), holding the key's row locked until the transaction ends, so that the check
-- and the write are one atomic step. Refusals are errors, by SQLSTATE: FL409 stale (the
-- message names the current fence: "... the current fence is N, ..."), FL403 not signed by
-- an installed key for `key` (or a bare fence once keys are installed), FL400 not a fence
-- token at all (with keys or without); each first rolls the transaction back, as
-- PostgreSQL's would end it. Idempotent: safe to apply again, by the same user.
-- Written for the mysql or mariadb client, whose DELIMITER command it uses.

-- The highest fence admitted per key. A row is never deleted: without it, a writer whose
-- lease has passed would be admitted again. The key is its UTF-8 bytes (up to 255
-- characters), compared byte for byte: MySQL's and MariaDB's `_bin` collations pad with
-- spaces, so that 'doc' and 'doc ' would share one fence.
CREATE TABLE IF NOT EXISTS fencelock_guard_fences (
    `key`      VARBINARY(1020) NOT NULL,
    fence      BIGINT      NOT NULL,
    updated_at DATETIME(6) NOT NULL COMMENT 'UTC',
    CONSTRAINT fencelock_guard_fences_pkey PRIMARY KEY (`key`),
    CONSTRAINT fencelock_guard_fences_positive CHECK (fence > 0)
) ENGINE = InnoDB;

-- A table made by an earlier version of this script, with a VARCHAR key, is converted (the
-- bytes stay as they are). Keys that differ only by trailing spaces shared its rows until
-- then; each has its own from now on.
SET @fencelock_guard_convert = (
    SELECT IF(COUNT(*) = 0, 'DO 0',
              'ALTER TABLE fencelock_guard_fences MODIFY `key` VARBINARY(1020) NOT NULL')
    FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'fencelock_guard_fences'
      AND COLUMN_NAME = 'key' AND DATA_TYPE <> 'varbinary');
PREPARE fencelock_guard_convert FROM @fencelock_guard_convert;
EXECUTE fencelock_guard_convert;
DEALLOCATE PREPARE fencelock_guard_convert;
SET @fencelock_guard_convert = NULL;

-- The secrets that sign fence tokens, shared with the lease server's --fence-key, each as
-- HMAC uses it (a key longer than 64 bytes by its SHA-256, as RFC 2104 says). None: the
-- procedure takes bare fences. Only the procedure's definer reads them: grant the roles that
-- call it EXECUTE on the procedure, and nothing on this database as a whole.
CREATE TABLE IF NOT EXISTS fencelock_guard_fence_keys (
    secret   VARBINARY(64) NOT NULL,
    added_at DATETIME(6)   NOT NULL COMMENT 'UTC',
    CONSTRAINT fencelock_guard_fence_keys_pkey PRIMARY KEY (secret),
    CONSTRAINT fencelock_guard_fence_keys_length CHECK (LENGTH(secret) >= 32)
) ENGINE = InnoDB;

DROP PROCEDURE IF EXISTS fencelock_guard_admit;

DELIMITER //
-- The rules are the Rust guard's (`Guard::check`): what is neither a bare fence nor a
-- well-formed `<fence>.<signature>` is no token at all, FL400, with keys or without. With
-- keys installed, only a token one of them signed, `key || "\n" || fence` (every key is
-- tried; signatures are compared through a keyed hash), passes; a bare fence or a token
-- none of them signed for `key` (forged, another key's, tampered) is FL403. Without keys, a
-- bare fence or the fence of a well-formed token, unverified. A fence is written in
-- canonical decimal (no sign, no leading zero) and is below 2^53; a signature is 43
-- characters of unpadded base64url.
CREATE PROCEDURE fencelock_guard_admit(
    IN in_key   TEXT CHARACTER SET utf8mb4,
    IN in_token TEXT CHARACTER SET utf8mb4
)
    MODIFIES SQL DATA
    SQL SECURITY DEFINER
    COMMENT 'fencelock guard: admits the token''s fence for the key, or refuses (FL409, FL403, FL400)'
BEGIN
    DECLARE dot         INT DEFAULT LOCATE('.', in_token);
    DECLARE fence_text  TEXT CHARACTER SET utf8mb4;
    DECLARE signature   TEXT CHARACTER SET utf8mb4;
    DECLARE wanted      BIGINT DEFAULT NULL;
    DECLARE highest     BIGINT DEFAULT NULL;
    DECLARE is_signed   BOOLEAN DEFAULT FALSE;
    DECLARE keyed       BOOLEAN DEFAULT FALSE;
    DECLARE matched     BOOLEAN DEFAULT FALSE;
    DECLARE no_more     BOOLEAN DEFAULT FALSE;
    DECLARE mac_key     VARBINARY(64);
    DECLARE inner_pad   VARBINARY(64);
    DECLARE outer_pad   VARBINARY(64);
    DECLARE message     BLOB;
    DECLARE expected    VARCHAR(64) CHARACTER SET ascii;
    DECLARE i           INT;
    DECLARE refusal     VARCHAR(128) CHARACTER SET utf8mb4;
    DECLARE installed CURSOR FOR SELECT k.secret FROM fencelock_guard_fence_keys AS k;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET no_more = TRUE;

    IF in_key IS NULL OR CHAR_LENGTH(in_key) > 255 THEN
        ROLLBACK;
        SIGNAL SQLSTATE 'FL400'
            SET MESSAGE_TEXT = 'the key of fencelock_guard_admit must not be NULL nor longer than 255 characters';
    END IF;

    -- Plain checks, one after the other, with no anchored pattern: `$` would let a final
    -- line break through.
    SET fence_text = IF(dot = 0, in_token, LEFT(in_token, dot - 1));
    SET signature = IF(dot = 0, NULL, SUBSTRING(in_token, dot + 1));
    IF CHAR_LENGTH(fence_text) BETWEEN 1 AND 16 AND fence_text NOT REGEXP '[^0-9]'
            AND LEFT(fence_text, 1) <> '0' THEN
        IF CAST(fence_text AS UNSIGNED) <= 9007199254740991 THEN
            SET wanted = CAST(fence_text AS UNSIGNED);
        END IF;
    END IF;
    IF CHAR_LENGTH(signature) = 43 AND signature NOT REGEXP '[^A-Za-z0-9_-]'
            AND LOCATE(CAST(RIGHT(signature, 1) AS BINARY), CAST('AEIMQUYcgkosw048' AS BINARY)) > 0 THEN
        SET is_signed = TRUE;
    ELSEIF signature IS NOT NULL THEN
        SET wanted = NULL;
    END IF;
    -- No token at all, whether or not keys are installed. Each refusal rolls back first,
    -- then raises a message of at most 128 characters (the most MESSAGE_TEXT holds), what
    -- matters first.
    IF wanted IS NULL THEN
        ROLLBACK;
        SET refusal = LEFT(CONCAT('not a fence token (a positive integer below 2^53, or ',
            '<fence>.<signature>): ', IFNULL(QUOTE(in_token), 'NULL')), 128);
        SIGNAL SQLSTATE 'FL400' SET MESSAGE_TEXT = refusal;
    END IF;

    SET message = CONCAT(CAST(in_key AS BINARY), 0x0A, CAST(fence_text AS BINARY));
    OPEN installed;
    each_key: LOOP
        FETCH installed INTO mac_key;
        IF no_more THEN
            LEAVE each_key;
        END IF;
        SET keyed = TRUE;
        IF wanted IS NOT NULL AND is_signed THEN
            -- HMAC-SHA256 (RFC 2104): the key, zero-padded to the 64-byte block, XORed with
            -- each pad byte by byte.
            SET mac_key = RPAD(mac_key, 64, 0x00), inner_pad = X'', outer_pad = X'', i = 1;
            WHILE i <= 64 DO
                SET inner_pad = CONCAT(inner_pad, CHAR(ASCII(SUBSTRING(mac_key, i, 1)) ^ 54 USING binary)),
                    outer_pad = CONCAT(outer_pad, CHAR(ASCII(SUBSTRING(mac_key, i, 1)) ^ 92 USING binary)),
                    i = i + 1;
            END WHILE;
            SET expected = REPLACE(REPLACE(TRIM(TRAILING '=' FROM TO_BASE64(UNHEX(SHA2(
                CONCAT(outer_pad, UNHEX(SHA2(CONCAT(inner_pad, message), 256))), 256)))), '+', '-'), '/', '_');
            -- Compared through a keyed hash, so that how long `=` takes tells nothing of how
            -- much of the signature is right.
            IF SHA2(CONCAT(mac_key, CAST(expected AS BINARY)), 256)
                    = SHA2(CONCAT(mac_key, CAST(signature AS BINARY)), 256) THEN
                SET matched = TRUE;
            END IF;
        END IF;
    END LOOP;
    CLOSE installed;

    IF keyed AND NOT matched THEN
        ROLLBACK;
        SET refusal = LEFT(CONCAT('fence token refused: ',
            CASE WHEN NOT is_signed THEN 'a bare fence is not accepted once keys are installed'
                 ELSE 'not signed by an installed key for this key' END,
            ', for key ', QUOTE(in_key)), 128);
        SIGNAL SQLSTATE 'FL403' SET MESSAGE_TEXT = refusal;
    END IF;

    -- Creates the key's row or, if it exists, locks it (changing nothing), then reads the
    -- fence that holds now: the locking read sees the latest committed value whatever the
    -- isolation level, and no other admit of the key gets in before this transaction ends.
    INSERT INTO fencelock_guard_fences (`key`, fence, updated_at)
        VALUES (in_key, wanted, UTC_TIMESTAMP(6))
        ON DUPLICATE KEY UPDATE `key` = `key`;
    SELECT f.fence INTO highest FROM fencelock_guard_fences AS f WHERE f.`key` = in_key FOR UPDATE;
    IF highest > wanted THEN
        ROLLBACK;
        SET refusal = LEFT(CONCAT('stale fence ', wanted, ': the current fence is ', highest,
            ', for key ', QUOTE(in_key)), 128);
        SIGNAL SQLSTATE 'FL409' SET MESSAGE_TEXT = refusal;
    END IF;
    -- GREATEST: called outside a transaction (autocommit, which protects no write, see the
    -- guard's docs) the row lock above ends with its statement, and a concurrent admit of a
    -- greater fence may have written since; the stored fence still never goes down.
    UPDATE fencelock_guard_fences SET fence = GREATEST(fence, wanted), updated_at = UTC_TIMESTAMP(6)
        WHERE `key` = in_key;
END //
DELIMITER ;
