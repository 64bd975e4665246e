-- fencekeeper 0.1.0: fencing tokens checked inside the writing transaction.
-- Frozen as released: a change is a new version with its upgrade script.
\echo Use "CREATE EXTENSION fencekeeper" to load this file. \quit

CREATE SCHEMA fencekeeper;
COMMENT ON SCHEMA fencekeeper IS 'Fencekeeper: fencing tokens checked in the writing transaction';
GRANT USAGE ON SCHEMA fencekeeper TO PUBLIC;

-- One checked record per resource ("fk2 TOKEN CRC32C", the format every Fencekeeper
-- store shares). Byte-wise collation: two keys share a mark only when their bytes
-- are equal. Written only by the extension's functions, which run their statements
-- on it as its owner; nobody else has a privilege on it.
CREATE TABLE fencekeeper.marks (
    resource text COLLATE "C" PRIMARY KEY,
    record text COLLATE "C" NOT NULL
);
COMMENT ON TABLE fencekeeper.marks IS 'The highest admitted fencing token of each resource, as a checked record';
REVOKE ALL ON fencekeeper.marks FROM PUBLIC;
-- pg_dump keeps the marks: a restore without them would re-admit stale writers.
SELECT pg_catalog.pg_extension_config_dump('fencekeeper.marks', '');

-- Every advance of a mark, one line in the audit format every Fencekeeper host
-- writes; inserted in the transaction that advanced the mark, so it commits and
-- rolls back with it.
CREATE TABLE fencekeeper.audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource text COLLATE "C" NOT NULL,
    entry json NOT NULL
);
COMMENT ON TABLE fencekeeper.audit IS 'Every advance of a mark, in the Fencekeeper audit format';
REVOKE ALL ON fencekeeper.audit FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fencekeeper.audit', '');
SELECT pg_catalog.pg_extension_config_dump('fencekeeper.audit_id_seq', '');

-- Raises (SQLSTATE FK001..FK006) unless the token is admitted; true when it
-- advanced the mark, false when it equals it.
CREATE FUNCTION fencekeeper.admit(resource text, token text) RETURNS boolean
    LANGUAGE c VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'fencekeeper_admit';
COMMENT ON FUNCTION fencekeeper.admit(text, text) IS
    'Admit a fencing token for a resource in this transaction, or raise (SQLSTATE FK001 stale, FK002 replayed, FK003 missing, FK004 malformed, FK005 unverified, FK006 undecided)';

-- CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ON t FOR EACH ROW
--     EXECUTE FUNCTION fencekeeper.fence('resource column or expression', 'token column');
CREATE FUNCTION fencekeeper.fence() RETURNS trigger
    LANGUAGE c VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'fencekeeper_fence';
COMMENT ON FUNCTION fencekeeper.fence() IS
    'Row trigger: admit each written row''s token for its resource (arguments: resource column or expression, token column)';
