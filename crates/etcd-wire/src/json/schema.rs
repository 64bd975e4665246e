//! The messages of etcd's `rpc.proto` and `kv.proto` that Fencekeeper's calls send and
//! read, field by field: each field's number (protobuf), its name (JSON: etcd's
//! gateway writes the `.proto` names, `create_revision`, `ID`) and its kind. Only
//! these fields are known; an answer's others are skipped, as in protobuf.

/// What a field holds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// `bytes`: base64 in JSON.
    Bytes,
    /// `string`.
    Text,
    /// `int64` (and the `uint64` of headers, never above `i64::MAX` in etcd): a
    /// string of digits in JSON, as proto3's JSON mapping writes 64-bit numbers.
    Int,
    /// `bool`.
    Bool,
    /// An enum: its values' names by number.
    Enum(&'static [&'static str]),
    /// A nested message.
    Message(&'static [Field]),
}

/// One field of a message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    pub number: u32,
    pub name: &'static str,
    pub kind: Kind,
    pub repeated: bool,
}

const fn one(number: u32, name: &'static str, kind: Kind) -> Field {
    Field { number, name, kind, repeated: false }
}

const fn many(number: u32, name: &'static str, kind: Kind) -> Field {
    Field { number, name, kind, repeated: true }
}

use Kind::{Bool, Bytes, Enum, Int, Message, Text};

// Requests.

const COMPARE_RESULT: &[&str] = &["EQUAL", "GREATER", "LESS", "NOT_EQUAL"];
const COMPARE_TARGET: &[&str] = &["VERSION", "CREATE", "MOD", "VALUE", "LEASE"];
const SORT_ORDER: &[&str] = &["NONE", "ASCEND", "DESCEND"];
const SORT_TARGET: &[&str] = &["KEY", "VERSION", "CREATE", "MOD", "VALUE"];

const COMPARE: &[Field] = &[
    one(1, "result", Enum(COMPARE_RESULT)),
    one(2, "target", Enum(COMPARE_TARGET)),
    one(3, "key", Bytes),
    one(4, "version", Int),
    one(5, "create_revision", Int),
    one(6, "mod_revision", Int),
    one(7, "value", Bytes),
    one(8, "lease", Int),
    one(64, "range_end", Bytes),
];

const RANGE_REQUEST: &[Field] = &[
    one(1, "key", Bytes),
    one(2, "range_end", Bytes),
    one(3, "limit", Int),
    one(4, "revision", Int),
    one(5, "sort_order", Enum(SORT_ORDER)),
    one(6, "sort_target", Enum(SORT_TARGET)),
    one(7, "serializable", Bool),
    one(8, "keys_only", Bool),
    one(9, "count_only", Bool),
    one(10, "min_mod_revision", Int),
    one(11, "max_mod_revision", Int),
    one(12, "min_create_revision", Int),
    one(13, "max_create_revision", Int),
];

const PUT_REQUEST: &[Field] = &[
    one(1, "key", Bytes),
    one(2, "value", Bytes),
    one(3, "lease", Int),
    one(4, "prev_kv", Bool),
    one(5, "ignore_value", Bool),
    one(6, "ignore_lease", Bool),
];

const DELETE_RANGE_REQUEST: &[Field] = &[one(1, "key", Bytes), one(2, "range_end", Bytes), one(3, "prev_kv", Bool)];

const REQUEST_OP: &[Field] = &[
    one(1, "request_range", Message(RANGE_REQUEST)),
    one(2, "request_put", Message(PUT_REQUEST)),
    one(3, "request_delete_range", Message(DELETE_RANGE_REQUEST)),
];

pub(crate) const TXN_REQUEST: &[Field] = &[
    many(1, "compare", Message(COMPARE)),
    many(2, "success", Message(REQUEST_OP)),
    many(3, "failure", Message(REQUEST_OP)),
];

pub(crate) const AUTHENTICATE_REQUEST: &[Field] = &[one(1, "name", Text), one(2, "password", Text)];

pub(crate) const LEASE_GRANT_REQUEST: &[Field] = &[one(1, "TTL", Int), one(2, "ID", Int)];

// Answers.

const HEADER: &[Field] =
    &[one(1, "cluster_id", Int), one(2, "member_id", Int), one(3, "revision", Int), one(4, "raft_term", Int)];

const KEY_VALUE: &[Field] = &[
    one(1, "key", Bytes),
    one(2, "create_revision", Int),
    one(3, "mod_revision", Int),
    one(4, "version", Int),
    one(5, "value", Bytes),
    one(6, "lease", Int),
];

const RANGE_RESPONSE: &[Field] = &[
    one(1, "header", Message(HEADER)),
    many(2, "kvs", Message(KEY_VALUE)),
    one(3, "more", Bool),
    one(4, "count", Int),
];

const PUT_RESPONSE: &[Field] = &[one(1, "header", Message(HEADER)), one(2, "prev_kv", Message(KEY_VALUE))];

const DELETE_RANGE_RESPONSE: &[Field] =
    &[one(1, "header", Message(HEADER)), one(2, "deleted", Int), many(3, "prev_kvs", Message(KEY_VALUE))];

const RESPONSE_OP: &[Field] = &[
    one(1, "response_range", Message(RANGE_RESPONSE)),
    one(2, "response_put", Message(PUT_RESPONSE)),
    one(3, "response_delete_range", Message(DELETE_RANGE_RESPONSE)),
];

pub(crate) const TXN_RESPONSE: &[Field] =
    &[one(1, "header", Message(HEADER)), one(2, "succeeded", Bool), many(3, "responses", Message(RESPONSE_OP))];

pub(crate) const AUTHENTICATE_RESPONSE: &[Field] = &[one(1, "header", Message(HEADER)), one(2, "token", Text)];

pub(crate) const LEASE_GRANT_RESPONSE: &[Field] =
    &[one(1, "header", Message(HEADER)), one(2, "ID", Int), one(3, "TTL", Int), one(4, "error", Text)];
