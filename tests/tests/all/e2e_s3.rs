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
use fencekeeper_harness::s3::{Aws, Boto, BotoRun};
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

/// Envoy with the filter in correctness mode (etcd holds the marks), `--protocol s3`
/// and `more` arguments.
fn envoy_in_front_of_with(store: &Moto, more: &[&str]) -> (Envoy, Etcd) {
    let etcd = Etcd::start().unwrap();
    let upstream = store.url().trim_start_matches("http://").to_owned();
    let etcd_url = etcd.client.to_string();
    let mut args = vec!["--upstream", &upstream, "--etcd", &etcd_url, "--provenance", "off", "--protocol", "s3"];
    args.extend(more);
    (Envoy::start(1, &args).unwrap(), etcd)
}

fn envoy_in_front_of(store: &Moto) -> (Envoy, Etcd) {
    envoy_in_front_of_with(store, &[])
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

    // The holder's client without the header hook: metadata reaches only
    // CreateMultipartUpload, and the parts and the Complete inherit its token.
    let metadata_only = Boto::new(fence, store.access_key()).multipart(BUCKET, key, &parts(b'm'), Some("34")).unwrap();
    assert!(metadata_only.ok, "{} {}", metadata_only.code, metadata_only.message);
    assert_eq!(store.get(BUCKET, key).unwrap().unwrap().0, parts(b'm').concat());

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

/// The S3 domain of the virtual-hosted-style stories: `reports.s3.test` names the
/// bucket (the client resolves every name under it to loopback).
const DOMAIN: &str = "s3.test";

/// The new holder writes the object path-style (`PUT /reports/q3.csv`), the old holder
/// writes it virtual-hosted-style (`PUT /q3.csv`, `Host: reports.s3.test`): one object
/// to the store. Returns the old holder's run.
fn styles_story(fence: &str, store: &Moto) -> BotoRun {
    let new = Boto::new(fence, store.access_key()).put(BUCKET, "q3.csv", NEW, Some("34")).unwrap();
    assert!(new.ok, "the new holder's path-style put: {} {}", new.code, new.message);
    Boto::new(fence, store.access_key()).virtual_hosted(DOMAIN).put(BUCKET, "q3.csv", OLD, Some("33")).unwrap()
}

/// Then the other way round: a newer holder writes virtual-hosted-style, and a
/// path-style write below its token is refused; the mark is the path-style key's.
fn assert_styles_share_one_mark(fence: &str, store: &Moto) {
    let newer = Boto::new(fence, store.access_key()).virtual_hosted(DOMAIN);
    let put = newer.put(BUCKET, "q3.csv", NEW, Some("35")).unwrap();
    assert!(put.ok, "the newer holder's virtual-hosted put: {} {}", put.code, put.message);
    let stale = Boto::new(fence, store.access_key()).put(BUCKET, "q3.csv", OLD, Some("34")).unwrap();
    assert_eq!((stale.ok, stale.status, stale.code.as_str()), (false, Some(409), "FencingTokenStale"));
    assert!(stale.message.contains("stale fencing token 34 for \"/reports/q3.csv\""), "{}", stale.message);
    assert_eq!(store.get(BUCKET, "q3.csv").unwrap().unwrap().0, NEW);
}

#[test]
fn without_a_fence_a_virtual_hosted_write_overwrites_what_a_path_style_one_wrote() {
    let store = moto();
    let old = styles_story(&store.url(), &store);
    assert!(old.ok, "{} {}", old.code, old.message);
    assert_eq!(store.get(BUCKET, "q3.csv").unwrap().unwrap().0, OLD, "the control: one object, the stale write lands");
}

#[test]
fn through_the_gateway_a_stale_write_cannot_dodge_its_mark_by_naming_the_bucket_in_the_host() {
    let store = moto();
    let gateway = Gateway::start(&store.url(), &["--protocol", "s3", "--s3-domain", DOMAIN]).unwrap();
    let old = styles_story(&gateway.url(), &store);
    assert_eq!((old.ok, old.status, old.code.as_str()), (false, Some(409), "FencingTokenStale"), "{}", old.message);
    assert_eq!(store.get(BUCKET, "q3.csv").unwrap().unwrap().0, NEW);
    assert_styles_share_one_mark(&gateway.url(), &store);
    assert_eq!(gateway.mark("/reports/q3.csv").unwrap().as_deref(), Some("35"));
}

#[test]
fn through_envoy_a_stale_write_cannot_dodge_its_mark_by_naming_the_bucket_in_the_host() {
    let store = moto();
    let (envoy, _etcd) = envoy_in_front_of_with(&store, &["--s3-domain", DOMAIN]);
    let fence = format!("http://{}", envoy.listen);
    let old = styles_story(&fence, &store);
    assert_eq!((old.ok, old.status, old.code.as_str()), (false, Some(409), "FencingTokenStale"), "{}", old.message);
    assert_eq!(store.get(BUCKET, "q3.csv").unwrap().unwrap().0, NEW);
    assert_styles_share_one_mark(&fence, &store);
}

/// Without the store's S3 domain the fence cannot tell `reports.s3.test` (a bucket)
/// from a plain host name: the write is refused, and nothing reaches the store.
fn assert_unplaceable_host_refused(fence: &str, store: &Moto) {
    let put = Boto::new(fence, store.access_key()).virtual_hosted(DOMAIN).put(BUCKET, "q3.csv", OLD, Some("33"));
    let put = put.unwrap();
    assert_eq!((put.ok, put.status, put.code.as_str()), (false, Some(400), "FencingRequestMalformed"));
    assert!(put.message.contains("--s3-domain"), "the reason says what to set: {}", put.message);
    assert_eq!(store.get(BUCKET, "q3.csv").unwrap(), None);
}

#[test]
fn without_the_s3_domain_a_virtual_hosted_write_is_refused_by_either_host() {
    let store = moto();
    let gateway = Gateway::start(&store.url(), &["--protocol", "s3"]).unwrap();
    assert_unplaceable_host_refused(&gateway.url(), &store);
    let (envoy, _etcd) = envoy_in_front_of(&store);
    assert_unplaceable_host_refused(&format!("http://{}", envoy.listen), &store);
}

/// The paused-holder story in the middle of a multipart upload, with clients that
/// send the token only as metadata (the aws CLI's way): the old holder (token 34)
/// creates an upload and sends its parts, then pauses; the new holder (35) writes the
/// object; the old holder resumes and completes its upload. Returns that Complete.
fn paused_mid_upload(fence: &str, store: &Moto) -> BotoRun {
    let key = "q3-big.csv";
    let old = Boto::new(fence, store.access_key());
    let (started, upload) = old.start_multipart(BUCKET, key, &parts(b'o'), Some("34")).unwrap();
    assert!(started.ok, "the old holder's parts: {} {}", started.code, started.message);
    let new = Boto::new(fence, store.access_key()).put(BUCKET, key, NEW, Some("35")).unwrap();
    assert!(new.ok, "the new holder's put: {} {}", new.code, new.message);
    old.complete_multipart(BUCKET, key, &upload.unwrap()).unwrap()
}

#[test]
fn without_a_fence_a_paused_holders_multipart_upload_completes_over_the_new_object() {
    let store = moto();
    let done = paused_mid_upload(&store.url(), &store);
    assert!(done.ok, "{} {}", done.code, done.message);
    assert_eq!(store.get(BUCKET, "q3-big.csv").unwrap().unwrap().0, parts(b'o').concat(), "the control");
}

/// Through a fence in front of `store`: the paused holder's Complete is refused, and
/// the aws CLI's multipart uploads (the token on CreateMultipartUpload only) go up in
/// parts that inherit it.
fn assert_multipart_uploads_inherit_their_token(fence: &str, store: &Moto) {
    let done = paused_mid_upload(fence, store);
    assert_eq!((done.ok, done.status, done.code.as_str()), (false, Some(409), "FencingTokenStale"), "{}", done.message);
    assert!(done.message.contains("stale fencing token 34"), "{}", done.message);
    assert_eq!(store.get(BUCKET, "q3-big.csv").unwrap().unwrap().0, NEW, "the new holder's object stays");

    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.csv");
    std::fs::write(&big, parts(b'c').concat()).unwrap();
    let aws = Aws::new(fence, store.access_key()).multipart_threshold(fencekeeper_harness::s3::MIN_PART);
    let up = aws.cp(&big, BUCKET, "q3-big.csv", Some("36")).unwrap();
    assert_eq!(up.code, Some(0), "the holder's multipart aws cp:\n{}", up.log);
    let (body, metadata) = store.get(BUCKET, "q3-big.csv").unwrap().unwrap();
    assert_eq!((body, metadata.get("fencing-token").map(String::as_str)), (parts(b'c').concat(), Some("36")));
    let stale = aws.cp(&big, BUCKET, "q3-big.csv", Some("35")).unwrap();
    assert_eq!(stale.code, Some(1), "{}", stale.log);
    assert!(stale.log.contains("FencingTokenStale"), "{}", stale.log);

    // A part of an upload the fence never saw start has no token to inherit.
    let r = request(fence, "PUT", "/reports/q3-big.csv?partNumber=1&uploadId=unknown", &[], b"x").unwrap();
    assert_eq!(r.status, 428, "{}", r.body);
}

#[test]
fn through_the_gateway_a_multipart_upload_keeps_its_token_and_a_paused_holders_complete_is_refused() {
    let store = moto();
    let gateway = Gateway::start(&store.url(), &["--protocol", "s3"]).unwrap();
    assert_multipart_uploads_inherit_their_token(&gateway.url(), &store);
}

#[test]
fn through_envoy_a_multipart_upload_keeps_its_token_and_a_paused_holders_complete_is_refused() {
    let store = moto();
    let (envoy, _etcd) = envoy_in_front_of(&store);
    assert_multipart_uploads_inherit_their_token(&format!("http://{}", envoy.listen), &store);
}
