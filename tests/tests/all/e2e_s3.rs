//! S3 clients through the fence, in front of a real S3 server: the aws CLI and boto3
//! against moto's S3 server (`moto_server`, PyPI), through `fencekeeper serve
//! --protocol s3` and through Envoy (`envoy-config --protocol s3`). moto checks every
//! request's SigV4 signature here (`harness/src/moto.rs`), so a fence that changed a
//! signed header would fail every story below.
//!
//! The paused-holder story as an S3 user lives it: the new holder's upload lands
//! with its token in the object's metadata, the old holder's later one is refused,
//! and the store keeps the new object. Each story has a control straight to moto,
//! where the stale write lands. The tokens are made up: the order is the story.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::Envoy;
use fencekeeper_harness::gateway::{request, Gateway};
use fencekeeper_harness::moto::Moto;
use fencekeeper_harness::s3::{Aws, Boto};
use fencekeeper_harness::services::Etcd;
use std::path::PathBuf;

const BUCKET: &str = "reports";
const NEW: &[u8] = b"q3,written by the new holder (token 34)\n";
const OLD: &[u8] = b"q3,written by the old holder, who paused (token 33)\n";

/// A moto server with the bucket.
fn moto() -> Moto {
    let store = Moto::start().unwrap();
    store.create_bucket(BUCKET).unwrap();
    store
}

/// The two holders' versions of one object, as files for the aws CLI.
struct Versions {
    new: PathBuf,
    old: PathBuf,
    _dir: tempfile::TempDir,
}

fn versions() -> Versions {
    let dir = tempfile::tempdir().unwrap();
    let (new, old) = (dir.path().join("new.csv"), dir.path().join("old.csv"));
    std::fs::write(&new, NEW).unwrap();
    std::fs::write(&old, OLD).unwrap();
    Versions { new, old, _dir: dir }
}

/// Envoy with the filter in correctness mode (etcd holds the marks), `--protocol s3`.
fn envoy_in_front_of(store: &Moto) -> (Envoy, Etcd) {
    let etcd = Etcd::start().unwrap();
    let upstream = store.url().trim_start_matches("http://").to_owned();
    let args = ["--upstream", &upstream, "--etcd", &etcd.client.to_string(), "--provenance", "off", "--protocol", "s3"];
    (Envoy::start(1, &args).unwrap(), etcd)
}

/// The story with the aws CLI through `fence` (a URL) in front of `store`: the new
/// holder copies with token 34, the old holder with 33. Returns the old one's run.
fn aws_story(fence: &str, store: &Moto, key: &str) -> fencekeeper_harness::s3::Run {
    let v = versions();
    let aws = Aws::new(fence, store.access_key());
    let new = aws.cp(&v.new, BUCKET, key, Some("34")).unwrap();
    assert_eq!(new.code, Some(0), "the new holder's upload failed:\n{}", new.log);
    let (body, metadata) = store.get(BUCKET, key).unwrap().unwrap();
    assert_eq!(body, NEW);
    assert_eq!(metadata.get("fencing-token").map(String::as_str), Some("34"), "the token is kept with the object");
    aws.cp(&v.old, BUCKET, key, Some("33")).unwrap()
}

#[test]
fn without_a_fence_the_old_holders_aws_cp_overwrites_the_new_object() {
    let store = moto();
    let old = aws_story(&store.url(), &store, "q3.csv");
    assert_eq!(old.code, Some(0), "{}", old.log);
    assert_eq!(store.get(BUCKET, "q3.csv").unwrap().unwrap().0, OLD, "the control: the stale upload lands");
}

/// What the aws CLI shows of the refusal, and what the store kept.
fn assert_refused(old: &fencekeeper_harness::s3::Run, store: &Moto, key: &str) {
    assert_eq!(old.code, Some(1), "the CLI reports the refusal as a failed upload:\n{}", old.log);
    assert!(
        old.log.contains("An error occurred (FencingTokenStale) when calling the PutObject operation"),
        "{}",
        old.log
    );
    assert!(old.log.contains(&format!("stale fencing token 33 for \"/{BUCKET}/{key}\"")), "{}", old.log);
    assert_eq!(store.get(BUCKET, key).unwrap().unwrap().0, NEW, "the store keeps the new holder's object");
}

#[test]
fn through_the_gateway_the_old_holders_aws_cp_is_refused_and_the_new_object_stays() {
    let store = moto();
    let gateway = Gateway::start(&store.url(), &["--protocol", "s3"]).unwrap();
    let old = aws_story(&gateway.url(), &store, "q3.csv");
    assert_refused(&old, &store, "q3.csv");
    assert_eq!(gateway.mark("/reports/q3.csv").unwrap().as_deref(), Some("34"));

    // The store checks signatures: a wrong secret, admitted by the fence (34 is the
    // mark), is refused by moto, and the client sees moto's answer.
    let (id, _) = store.access_key();
    let forged = Aws::new(&gateway.url(), (id, "not-the-secret")).cp(&versions().new, BUCKET, "q3.csv", Some("34"));
    let forged = forged.unwrap();
    assert_eq!(forged.code, Some(1), "{}", forged.log);
    assert!(forged.log.contains("SignatureDoesNotMatch"), "{}", forged.log);
}

#[test]
fn through_envoy_the_old_holders_aws_cp_is_refused_and_the_new_object_stays() {
    let store = moto();
    let (envoy, _etcd) = envoy_in_front_of(&store);
    let old = aws_story(&format!("http://{}", envoy.listen), &store, "q3.csv");
    assert_refused(&old, &store, "q3.csv");
}

/// Two parts: S3's smallest part (5 MiB), then a byte.
fn parts(fill: u8) -> Vec<Vec<u8>> {
    vec![vec![fill; 5 << 20], vec![fill]]
}

/// The boto3 story through `fence` in front of `store`, each holder's client sending
/// its token on every request (the event hook of docs/clients.md): a multipart upload
/// by the new holder, then the old holder's multipart upload and delete, then the new
/// holder's delete.
fn boto_story(fence: &str, store: &Moto, fenced: bool) {
    let key = "q3-big.csv";
    let new = Boto::new(fence, store.access_key()).with_token_header("34");
    let old = Boto::new(fence, store.access_key()).with_token_header("33");
    let up = new.multipart(BUCKET, key, &parts(b'n'), Some("34")).unwrap();
    assert!(up.ok, "the new holder's multipart upload: {} {}", up.code, up.message);
    assert_eq!(store.get(BUCKET, key).unwrap().unwrap().0, parts(b'n').concat());

    let stale = old.multipart(BUCKET, key, &parts(b'o'), Some("33")).unwrap();
    let gone = old.delete(BUCKET, key).unwrap();
    if !fenced {
        assert!(stale.ok && gone.ok, "the control: {} {}; {} {}", stale.code, stale.message, gone.code, gone.message);
        assert_eq!(store.get(BUCKET, key).unwrap(), None, "the control: the stale upload landed, then its delete");
        return;
    }
    assert_eq!((stale.ok, stale.status, stale.code.as_str()), (false, Some(409), "FencingTokenStale"));
    assert!(stale.message.contains("CreateMultipartUpload"), "refused at its first step: {}", stale.message);
    assert_eq!((gone.ok, gone.status, gone.code.as_str()), (false, Some(409), "FencingTokenStale"));
    assert_eq!(store.get(BUCKET, key).unwrap().unwrap().0, parts(b'n').concat(), "the new object stays");

    // Metadata alone reaches only the steps that create an object: the first
    // UploadPart carries no token, and is refused.
    let metadata_only = Boto::new(fence, store.access_key()).multipart(BUCKET, key, &parts(b'm'), Some("35")).unwrap();
    assert_eq!((metadata_only.status, metadata_only.code.as_str()), (Some(428), "FencingTokenMissing"));
    assert!(metadata_only.message.contains("UploadPart"), "{}", metadata_only.message);

    let deleted = new.delete(BUCKET, key).unwrap();
    assert!(deleted.ok, "the holder's delete: {} {}", deleted.code, deleted.message);
    assert_eq!(store.get(BUCKET, key).unwrap(), None);
}

#[test]
fn without_a_fence_the_old_holders_boto3_multipart_upload_and_delete_land() {
    let store = moto();
    boto_story(&store.url(), &store, false);
}

#[test]
fn through_the_gateway_boto3_multipart_uploads_and_deletes_are_fenced() {
    let store = moto();
    let gateway = Gateway::start(&store.url(), &["--protocol", "s3"]).unwrap();
    boto_story(&gateway.url(), &store, true);
    assert_unfenceable_refused(&gateway.url());
}

#[test]
fn through_envoy_boto3_multipart_uploads_and_deletes_are_fenced() {
    let store = moto();
    let (envoy, _etcd) = envoy_in_front_of(&store);
    let fence = format!("http://{}", envoy.listen);
    boto_story(&fence, &store, true);
    assert_unfenceable_refused(&fence);
}

/// What the fence refuses before the store sees it, so unsigned requests show it:
/// DeleteObjects (its keys are in the body), and a token sent twice with two values.
fn assert_unfenceable_refused(fence: &str) {
    let body = b"<Delete><Object><Key>q3.csv</Key></Object></Delete>";
    let r = request(fence, "POST", "/reports?delete", &[("fencing-token", "99")], body).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("<Code>FencingRequestMalformed</Code>"), "{}", r.body);
    assert!(r.body.contains("DeleteObjects"), "{}", r.body);
    let two = [("fencing-token", "99"), ("x-amz-meta-fencing-token", "98")];
    let r = request(fence, "PUT", "/reports/q3.csv", &two, b"x").unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("sent twice with two values"), "{}", r.body);
}
