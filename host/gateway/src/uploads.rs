//! S3 multipart uploads this gateway saw start, and the token each was admitted with:
//! the engine's rules (`fencekeeper_engine::uploads`: which step a write is, what is
//! remembered of the store's answer, for how long), kept in a map of this process.
//!
//! The memory is a convenience, never a way in: a step it does not know (another
//! gateway's upload, one from before a restart, one evicted) has no token and is
//! refused as missing, as without it. Upload ids are the store's, long and random: a
//! client that knows another's id could use its token only for that same object and
//! upload, and must still sign its requests for the store.

use crate::Body;
use fencekeeper_engine::uploads::{self, Follow, Step, Upload, CAPACITY, MAX_ANSWER};
use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame, SizeHint};
use hyper::Response;
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

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
        uploads::of_step(target, path).and_then(|(path, id)| self.token(&path, &id))
    }

    /// Follow the store's `response` to an admitted write at `step`, made with
    /// `token`: remember a Create's upload, forget a finished one. The answer goes on
    /// unchanged in every case: a Create answer over the engine's limit, or one that
    /// does not arrive whole within `timeout`, is handed on as it comes, and its upload
    /// is not remembered (its steps then need their own token).
    pub async fn answered(
        &self,
        step: Step,
        token: &str,
        response: Response<Body>,
        timeout: Duration,
    ) -> Response<Body> {
        match step.answered(response.status().as_u16()) {
            Follow::Nothing => response,
            Follow::Forget((path, id)) => {
                self.forget(&path, &id);
                response
            }
            Follow::ReadUploadId(path) => {
                let (parts, mut body) = response.into_parts();
                let mut read = Vec::new();
                let whole = tokio::time::timeout(timeout, async {
                    while read.len() <= MAX_ANSWER {
                        match body.frame().await {
                            None => return Ok(true),
                            Some(Ok(frame)) => read.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..])),
                            Some(Err(e)) => return Err(e),
                        }
                    }
                    Ok(false)
                })
                .await;
                match &whole {
                    Ok(Ok(true)) => match uploads::upload_id_in_answer(&read) {
                        Some(id) => self.remember(&path, id, token),
                        None => tracing::warn!("a CreateMultipartUpload answer named no upload id the gateway can keep; its parts need their own token"),
                    },
                    Ok(Ok(false)) => tracing::warn!("a CreateMultipartUpload answer over {MAX_ANSWER} bytes; handed on, its parts need their own token"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "the store's CreateMultipartUpload answer failed while read; handed on as far as it came"),
                    Err(_) => tracing::warn!("the store's CreateMultipartUpload answer did not arrive whole within {timeout:?}; handed on, its parts need their own token"),
                }
                let body = Prefixed { read: Some(Bytes::from(read)), rest: body };
                Response::from_parts(parts, body.boxed())
            }
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

/// A body whose first bytes were already read: those, then the rest as it comes.
struct Prefixed {
    read: Option<Bytes>,
    rest: Body,
}

impl hyper::body::Body for Prefixed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(read) = self.read.take().filter(|r| !r.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.as_ref().is_none_or(Bytes::is_empty) && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.read.as_ref().map_or(0, |r| r.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + read);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + read);
        }
        hint
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
