//! Envoy's own answers in the client's form: the HTTP connection manager's
//! `local_reply_config`.
//!
//! When the store cannot be reached, breaks off the exchange or is late, and when a
//! held body passes Envoy's buffer limit, the answer is Envoy's own local reply, which
//! the filter never sees: plain text ("upstream request timeout"), 503 for a store out
//! of reach. The gateway answers these with the engine's [`Answer`]: 502 or 504 (413),
//! in the form the client reads. The mappers written here make Envoy answer the same
//! status in the same form: S3's error document with the engine's `Code` for S3
//! clients, a one-line reason for plain ones, the engine's gRPC status for gRPC ones.
//!
//! Every mapper matches on what only Envoy's own replies carry (a response flag set by
//! the router, the details of the buffer-limit reply): the filter's own answers (its
//! refusals, sent as local replies too) pass every mapper unchanged.

use fencekeeper_core::Protocol;
use fencekeeper_gateway::refusal::{Answer, Failure, Form};
use std::fmt::Write as _;

/// The response flags of a store out of reach or breaking off the exchange: no
/// connection (UF), no healthy host (UH), the connection closed (UC) or the stream
/// reset (UR) before an answer, retries used up (URX), an answer that is not HTTP
/// (UPE). The gateway answers all of these 502.
const OUT_OF_REACH: &str = "[UF, UH, UC, UR, URX, UPE]";

/// The filter that matches gRPC requests: they get a gRPC status, not a body.
const GRPC: &str = "header_filter: { header: { name: content-type, string_match: { prefix: application/grpc } } }";

/// One case Envoy answers itself: which of its replies, and what the fence answers.
struct Case {
    /// The access-log filter that picks Envoy's reply out (never the filter's own).
    filter: String,
    failure: Failure,
    /// The one-line reason; [`DETAILS`] in it is Envoy's word for what happened.
    reason: String,
}

/// What happened, as Envoy tells it (`upstream_reset_before_response_started{connection_termination}`):
/// one line, its spaces made underscores.
const DETAILS: &str = "%RESPONSE_CODE_DETAILS%";

/// What happened, as Envoy's response flags (`UF`, `UC`): capitals and commas, for S3's
/// XML document, where Envoy would write the details unescaped.
const FLAGS: &str = "%RESPONSE_FLAGS%";

/// The `local_reply_config` block, indented for the connection manager's
/// `typed_config`: for `upstream` (as written in `--upstream`), its route `timeout`
/// (Envoy's duration), the protocol and, with conditional writes, the largest body.
pub(super) fn config(upstream: &str, timeout: &str, protocol: Protocol, max_body: Option<u64>) -> String {
    let mut cases = vec![
        Case {
            filter: format!("response_flag_filter: {{ flags: {OUT_OF_REACH} }}"),
            failure: Failure::UpstreamFailed,
            reason: format!(
                "upstream {upstream} failed ({DETAILS}): the store could not be reached or broke off \
                 the exchange; retry when it answers"
            ),
        },
        Case {
            filter: "response_flag_filter: { flags: [UT] }".to_owned(),
            failure: Failure::UpstreamTimeout,
            reason: format!(
                "upstream {upstream} did not answer within {timeout}: the store may still apply the write; read it \
                 back, or retry, when the store answers"
            ),
        },
    ];
    if let Some(max) = max_body {
        // A body that passes the route's buffer limit while Envoy still holds the
        // headers for the filter. The filter refuses a body over the limit itself as
        // it passes (or by its Content-Length), so this is Envoy's answer only when
        // the buffer fills before the filter sees the body.
        cases.push(Case {
            filter: "extension_filter:
  name: envoy.access_loggers.extension_filters.cel
  typed_config:
    \"@type\": type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter
    expression: \"response.code_details == 'request_payload_too_large'\""
                .to_owned(),
            failure: Failure::TooLarge,
            reason: format!(
                "the body passed {max} bytes, and the fence holds a write's body whole up to that \
                 (conditional_max_body; envoy-config --conditional-max-body): nothing was written"
            ),
        });
    }
    let form = if protocol == Protocol::S3 { Form::S3 } else { Form::Text };
    let mut out = String::from(
        "          # Envoy's own answers (the store out of reach or late, a body over the
          # buffer limit) in the form the client reads, as the gateway gives them;
          # the filter's own answers match none of these mappers.
          local_reply_config:
            mappers:
",
    );
    for case in &cases {
        grpc_mapper(&mut out, case);
    }
    for case in &cases {
        mapper(&mut out, case, form);
    }
    out
}

/// The mapper of `case` for gRPC clients: the engine's gRPC status, the reason as
/// its message (Envoy writes the body of a gRPC reply as `grpc-message`).
fn grpc_mapper(out: &mut String, case: &Case) {
    let grpc = Answer::failure(case.failure, &case.reason, Form::Grpc);
    let _ = write!(
        out,
        "            - filter:
                and_filter:
                  filters:
                  - {filter}
                  - {GRPC}
              status_code: {status}
              headers_to_add:
              - header: {{ key: grpc-status, value: \"{grpc_status}\" }}
                append_action: OVERWRITE_IF_EXISTS_OR_ADD
              body_format_override:
                text_format_source: {{ inline_string: {message} }}
",
        filter = indent(&case.filter, 20),
        status = grpc.status,
        grpc_status = case.failure.grpc_status(),
        message = quoted(&grpc.reason),
    );
}

/// The mapper of `case` for every other client: the engine's answer in `form`.
fn mapper(out: &mut String, case: &Case, form: Form) {
    let reason = match form {
        Form::S3 => case.reason.replace(DETAILS, FLAGS),
        _ => case.reason.clone(),
    };
    let answer = Answer::failure(case.failure, &reason, form);
    let _ = write!(
        out,
        "            - filter:
                {filter}
              status_code: {status}
              body_format_override:
                text_format_source: {{ inline_string: {body} }}
                content_type: {content_type}
",
        filter = indent(&case.filter, 16),
        status = answer.status,
        body = quoted(&answer.body),
        content_type = quoted(answer.header("content-type").unwrap_or_default()),
    );
}

/// `text`, a YAML block whose first line is written at column `column`, with its
/// other lines moved there too.
fn indent(text: &str, column: usize) -> String {
    text.replace('\n', &format!("\n{}", " ".repeat(column)))
}

/// `text` as a YAML double-quoted scalar (a JSON string is one), line breaks escaped.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}
