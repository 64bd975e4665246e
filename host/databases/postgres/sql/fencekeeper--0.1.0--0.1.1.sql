-- fencekeeper 0.1.0 -> 0.1.1: the verified read of one mark.
\echo Use "ALTER EXTENSION fencekeeper UPDATE TO '0.1.1'" to load this file. \quit

CREATE FUNCTION fencekeeper.mark(resource text) RETURNS text
    LANGUAGE c STRICT VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'fencekeeper_mark';
COMMENT ON FUNCTION fencekeeper.mark(text) IS
    'The resource''s mark, its record verified (NULL: no mark; a damaged record raises FK006)';
