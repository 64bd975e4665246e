//! S3 multipart uploads, as both HTTP hosts follow them.
//!
//! The aws CLI uploads a large file in parts: CreateMultipartUpload carries the
//! object's metadata, so the token (`--metadata fencing-token=34`), but UploadPart,
//! CompleteMultipartUpload and AbortMultipartUpload carry neither metadata nor any
//! header the CLI lets a user add. So a host remembers, per object path and upload id
//! (read from the Create's answer), the token the Create was admitted with, and a
//! later step of that upload that sends no token of its own is decided with it. The
//! step is still decided: the Complete of an upload whose holder lost the lock
//! meanwhile is refused as stale.
//!
//! The memory is a convenience, never a way in: a step it does not know (evicted,
//! another instance's, from before a restart) has no token and is refused as missing.
//! Where the memory lives is the host's (the gateway's map, the proxy's shared data);
//! what a host remembers and for how long is decided here:
//! * at most [`CAPACITY`] uploads, the oldest evicted first;
//! * the upload id is read from a Create answer of at most [`MAX_ANSWER`] bytes that
//!   arrives within the host's upstream timeout. Past either, the store's answer goes
//!   to the client unchanged (the store did create the upload; an error would make the
//!   client start another) and nothing is remembered, so its steps need their own
//!   token;
//! * a Complete or Abort the store accepted (2xx) forgets its upload.

use fencekeeper_core::http::decoded_path;
use fencekeeper_core::s3::{self, Multipart};

/// The most uploads a host remembers at once.
pub const CAPACITY: usize = 4096;

/// The largest CreateMultipartUpload answer read for its upload id (a few hundred
/// bytes in practice).
pub const MAX_ANSWER: usize = 64 << 10;

/// An upload: the object's decoded path and the upload id (percent-decoded).
pub type Upload = (Vec<u8>, Vec<u8>);

/// A fenced S3 write's place in a multipart upload, as far as a host follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// None it follows.
    Other,
    /// CreateMultipartUpload (`POST ?uploads`) of the object at this path: its answer
    /// names the upload.
    Create(Vec<u8>),
    /// CompleteMultipartUpload (`POST ?uploadId=`) or AbortMultipartUpload (`DELETE
    /// ?uploadId=`): a success ends the upload.
    Finish(Upload),
}

impl Step {
    /// The step of a request with `method` and `target` (path and query, as sent) to
    /// the object at the decoded `path`.
    pub fn of(method: &str, target: &[u8], path: &[u8]) -> Step {
        match s3::multipart(method, target) {
            Multipart::Create => Step::Create(path.to_vec()),
            Multipart::Ends(id) => Step::Finish((path.to_vec(), decoded(id))),
            Multipart::Within(_) | Multipart::None => Step::Other,
        }
    }

    /// What the store's answer with `status` to this step leads to.
    pub fn answered(self, status: u16) -> Follow {
        match self {
            Step::Create(path) if status == 200 => Follow::ReadUploadId(path),
            Step::Finish(upload) if (200..300).contains(&status) => Follow::Forget(upload),
            _ => Follow::Nothing,
        }
    }
}

/// What a host does after the store answered a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Follow {
    /// Nothing to remember or forget.
    Nothing,
    /// Read the answer (up to [`MAX_ANSWER`] bytes, within the upstream timeout) for
    /// the upload id of the object at this path ([`upload_id_in_answer`]), and
    /// remember it with the step's token.
    ReadUploadId(Vec<u8>),
    /// Forget this upload.
    Forget(Upload),
}

/// The upload a request that sent no token of its own belongs to, by its `target`'s
/// `uploadId` (decoded), for the object at the decoded `path`: the key a host looks
/// its token up by.
pub fn of_step(target: &[u8], path: &[u8]) -> Option<Upload> {
    s3::upload_id(target).map(|id| (path.to_vec(), decoded(id)))
}

/// The upload id a CreateMultipartUpload answer names (as the store wrote it, which
/// is what later steps send decoded), if the answer is whole and names one.
pub fn upload_id_in_answer(answer: &[u8]) -> Option<&[u8]> {
    if answer.len() > MAX_ANSWER {
        return None;
    }
    s3::upload_id_in_answer(answer)
}

/// A query value, percent-decoded (as the store reads it).
fn decoded(value: &[u8]) -> Vec<u8> {
    decoded_path(value).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_told_by_method_and_query() {
        assert_eq!(Step::of("POST", b"/b/k?uploads", b"/b/k"), Step::Create(b"/b/k".to_vec()));
        let finish = Step::Finish((b"/b/k".to_vec(), b"a+b".to_vec()));
        assert_eq!(Step::of("POST", b"/b/k?uploadId=a%2Bb", b"/b/k"), finish, "the id is decoded");
        assert_eq!(Step::of("DELETE", b"/b/k?uploadId=a%2Bb", b"/b/k"), finish);
        assert_eq!(Step::of("PUT", b"/b/k?partNumber=1&uploadId=a", b"/b/k"), Step::Other, "a part ends nothing");
        assert_eq!(Step::of("PUT", b"/b/k", b"/b/k"), Step::Other);
        assert_eq!(of_step(b"/b/k?partNumber=1&uploadId=a%2Bb", b"/b/k"), Some((b"/b/k".to_vec(), b"a+b".to_vec())));
        assert_eq!(of_step(b"/b/k?partNumber=1", b"/b/k"), None);
    }

    #[test]
    fn only_a_created_upload_is_read_and_only_a_finished_one_forgotten() {
        let create = || Step::Create(b"/b/k".to_vec());
        assert_eq!(create().answered(200), Follow::ReadUploadId(b"/b/k".to_vec()));
        assert_eq!(create().answered(403), Follow::Nothing, "a refused Create names no upload");
        let finish = || Step::Finish((b"/b/k".to_vec(), b"id".to_vec()));
        assert_eq!(finish().answered(204), Follow::Forget((b"/b/k".to_vec(), b"id".to_vec())));
        assert_eq!(finish().answered(500), Follow::Nothing, "a failed Complete may be retried");
    }

    #[test]
    fn an_answer_over_the_limit_names_no_upload() {
        let answer = b"<InitiateMultipartUploadResult><UploadId>u1</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(upload_id_in_answer(answer), Some(&b"u1"[..]));
        let mut long = answer.to_vec();
        long.resize(MAX_ANSWER + 1, b' ');
        assert_eq!(upload_id_in_answer(&long), None);
    }
}
