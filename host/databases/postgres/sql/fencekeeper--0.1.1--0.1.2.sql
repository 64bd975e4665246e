-- fencekeeper 0.1.1 -> 0.1.2: a fenced table's token column checked when its trigger
-- is attached or the table altered, not only at the first write.
\echo Use "ALTER EXTENSION fencekeeper UPDATE TO '0.1.2'" to load this file. \quit

-- Raises the token column's error (42703 no such column, 42804 a type that does not
-- carry a token, 55000 a column the table fills itself) for every fencekeeper.fence
-- trigger on a table the command created a trigger on or altered.
CREATE FUNCTION fencekeeper.check_fence() RETURNS event_trigger
    LANGUAGE c VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'fencekeeper_check_fence';
COMMENT ON FUNCTION fencekeeper.check_fence() IS
    'Event trigger: check the token column of each fencekeeper.fence trigger on the tables a CREATE TRIGGER or ALTER TABLE touched';
CREATE EVENT TRIGGER fencekeeper_check_fence ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'ALTER TABLE')
    EXECUTE FUNCTION fencekeeper.check_fence();
COMMENT ON EVENT TRIGGER fencekeeper_check_fence IS
    'Refuse a fencekeeper.fence trigger whose token column cannot carry a writer''s token';
