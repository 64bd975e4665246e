//! S3 multipart uploads this gateway saw start, and the token each was admitted with.
//!
//! The aws CLI uploads a large file in parts: CreateMultipartUpload carries the
//! object's metadata, so the token (`--metadata fencing-token=34`), but UploadPart,
//! CompleteMultipartUpload and AbortMultipartUpload carry neither metadata nor any
//! header the CLI lets a user add. So the gateway remembers, per object path and
//! upload id (from the Create answer), the token the Create was admitted with, and a
//! later step of that upload that sends no token of its own is decided with it. The
//! step is still decided: the Complete of an upload whose holder lost the lock
//! meanwhile is refused as stale, so the object is not replaced.
//!
//! The memory is a convenience, never a way in: a step it does not know (another
//! gateway's upload, one from before a restart, one evicted) has no token and is
//! refused as missing, as without it. It holds at most [`CAPACITY`] uploads, the
//! oldest evicted first, and forgets an upload once its Complete or Abort succeeded.
//! Upload ids are the store's, long and random: a client that knows another's id
//! could use its token only for that same object and upload, and must still sign its
//! requests for the store.

use crate::refusal::{self, full};
use crate::Body;
use fencekeeper_core::http;
use fencekeeper_core::s3::{self, Multipart};
use http_body_util::{BodyExt, Limited};
use hyper::{Method, Response, StatusCode};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// The most uploads remembered at once.
pub const CAPACITY: usize = 10_000;

/// The largest CreateMultipartUpload answer read (a few hundred bytes in practice).
const MAX_ANSWER: usize = 64 << 10;

/// An upload: the object's decoded path and the upload id (percent-decoded).
type Upload = (Vec<u8>, Vec<u8>);

/// A fenced S3 write's place in a multipart upload, as far as the memory follows it.
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
    pub fn of(method: &Method, target: &[u8], path: &[u8]) -> Step {
        match s3::multipart(method.as_str(), target) {
            Multipart::Create => Step::Create(path.to_vec()),
            Multipart::Ends(id) => Step::Finish((path.to_vec(), decoded(id))),
            Multipart::Within(_) | Multipart::None => Step::Other,
        }
    }
}

/// A query value, percent-decoded (as the store reads it).
fn decoded(value: &[u8]) -> Vec<u8> {
    http::decoded_path(value).collect()
}

/// The remembered uploads.
#[derive(Default)]
pub struct Uploads {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    tokens: HashMap<Upload, String>,
    /// Insertion order, for eviction; may hold uploads already forgotten.
    order: VecDeque<Upload>,
}

impl Uploads {
    /// Remember that the upload `id` of the object at `path` started with `token`.
    pub fn remember(&self, path: &[u8], id: &[u8], token: &str) {
        let mut inner = self.lock();
        let upload = (path.to_vec(), id.to_vec());
        if inner.tokens.insert(upload.clone(), token.to_owned()).is_none() {
            inner.order.push_back(upload);
        }
        while inner.tokens.len() > CAPACITY {
            match inner.order.pop_front() {
                Some(oldest) => {
                    inner.tokens.remove(&oldest);
                }
                None => break,
            }
        }
        // Forgotten uploads left in the order: drop them before it grows past twice
        // the capacity.
        if inner.order.len() > 2 * CAPACITY {
            let Inner { tokens, order } = &mut *inner;
            order.retain(|u| tokens.contains_key(u));
        }
    }

    /// The token the upload `id` of the object at `path` started with, if remembered.
    pub fn token(&self, path: &[u8], id: &[u8]) -> Option<String> {
        self.lock().tokens.get(&(path.to_vec(), id.to_vec())).cloned()
    }

    /// The token a request that sent none inherits: its upload's (`target`'s
    /// `uploadId`, of the object at the decoded `path`), when remembered.
    pub fn inherited(&self, target: &[u8], path: &[u8]) -> Option<String> {
        s3::upload_id(target).and_then(|id| self.token(path, &decoded(id)))
    }

    /// Follow the store's `response` to an admitted write at `step`, made with
    /// `token`: remember a Create's upload (its answer is read whole, up to 64 KiB
    /// within `timeout`, and handed on unchanged), forget a finished one.
    pub async fn answered(
        &self,
        step: Step,
        token: &str,
        response: Response<Body>,
        timeout: Duration,
    ) -> Response<Body> {
        match step {
            Step::Create(path) if response.status() == StatusCode::OK => {
                let (parts, body) = response.into_parts();
                let bytes = match tokio::time::timeout(timeout, Limited::new(body, MAX_ANSWER).collect()).await {
                    Ok(Ok(collected)) => collected.to_bytes(),
                    Ok(Err(e)) => {
                        let reason = format!("could not read the store's CreateMultipartUpload answer: {e}");
                        return refusal::error(StatusCode::BAD_GATEWAY, &reason);
                    }
                    Err(_) => {
                        let reason =
                            format!("the store's CreateMultipartUpload answer did not arrive within {timeout:?}");
                        return refusal::error(StatusCode::GATEWAY_TIMEOUT, &reason);
                    }
                };
                match s3::upload_id_in_answer(&bytes) {
                    Some(id) => self.remember(&path, id, token),
                    None => tracing::warn!("a CreateMultipartUpload answer named no upload id the gateway can keep; its parts need their own token"),
                }
                Response::from_parts(parts, full(bytes))
            }
            Step::Finish((path, id)) if response.status().is_success() => {
                self.forget(&path, &id);
                response
            }
            _ => response,
        }
    }

    /// Forget the upload (it completed, or was aborted).
    pub fn forget(&self, path: &[u8], id: &[u8]) {
        self.lock().tokens.remove(&(path.to_vec(), id.to_vec()));
    }

    /// How many uploads are remembered.
    pub fn len(&self) -> usize {
        self.lock().tokens.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map is consistent after every statement, so a panic elsewhere while it
        // was held leaves nothing half-done.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_is_known_by_its_object_and_id_until_forgotten() {
        let u = Uploads::default();
        u.remember(b"/b/k", b"id1", "34");
        assert_eq!(u.token(b"/b/k", b"id1").as_deref(), Some("34"));
        assert_eq!(u.token(b"/b/other", b"id1"), None, "an id names one object's upload only");
        assert_eq!(u.token(b"/b/k", b"id2"), None);
        u.forget(b"/b/k", b"id1");
        assert_eq!(u.token(b"/b/k", b"id1"), None);
        assert!(u.is_empty());
    }

    #[test]
    fn steps_are_told_by_method_and_query() {
        assert!(matches!(Step::of(&Method::POST, b"/b/k?uploads", b"/b/k"), Step::Create(p) if p == b"/b/k"));
        let finish = |m: &Method| match Step::of(m, b"/b/k?uploadId=a%2Bb", b"/b/k") {
            Step::Finish((p, id)) => Some((p, id)),
            _ => None,
        };
        assert_eq!(finish(&Method::POST), Some((b"/b/k".to_vec(), b"a+b".to_vec())), "the id is decoded");
        assert!(finish(&Method::DELETE).is_some());
        assert!(finish(&Method::PUT).is_none(), "an UploadPart ends nothing");
        assert!(matches!(Step::of(&Method::PUT, b"/b/k", b"/b/k"), Step::Other));
        let u = Uploads::default();
        u.remember(b"/b/k", b"a+b", "34");
        assert_eq!(u.inherited(b"/b/k?partNumber=1&uploadId=a%2Bb", b"/b/k").as_deref(), Some("34"));
        assert_eq!(u.inherited(b"/b/k?partNumber=1", b"/b/k"), None);
    }

    #[test]
    fn the_oldest_upload_is_evicted_past_the_capacity_and_the_order_stays_bounded() {
        let u = Uploads::default();
        for n in 0..=CAPACITY {
            u.remember(b"/b/k", n.to_string().as_bytes(), "1");
        }
        assert_eq!(u.len(), CAPACITY);
        assert_eq!(u.token(b"/b/k", b"0"), None, "the oldest went first");
        assert_eq!(u.token(b"/b/k", CAPACITY.to_string().as_bytes()).as_deref(), Some("1"));
        for n in 0..3 * CAPACITY {
            let id = format!("x{n}");
            u.remember(b"/b/k", id.as_bytes(), "1");
            u.forget(b"/b/k", id.as_bytes());
        }
        assert!(u.lock().order.len() <= 2 * CAPACITY + 1);
    }
}
